"""flashinfer's RMSNorm module built ahead, run inside the stack's interpreter by host/kernels.py.

`python -c SOURCE ARCHS OUT` (ARCHS as `9.0 10.0`): flashinfer's own JIT spec for `norm`, compiled by
its own ninja into a scratch workspace ($FLASHINFER_WORKSPACE_BASE, set by the parent), then copied
to OUT/flashinfer-aot/norm/norm.so, where flashinfer's AOT loader looks. One JSON line on stdout:
{"module": "norm", "flashinfer": VERSION}. Standard library and flashinfer only.
"""

import json
import os
import shutil
import sys
from importlib.metadata import version


def main():
    archs, out = sys.argv[1], sys.argv[2]
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = archs  # read when flashinfer's JIT is imported
    from flashinfer.jit.norm import gen_norm_module
    spec = gen_norm_module()
    spec.build(verbose=False)
    dest = os.path.join(out, "flashinfer-aot", spec.name)
    os.makedirs(dest, exist_ok=True)
    shutil.copyfile(spec.jit_library_path, os.path.join(dest, spec.name + ".so"))
    print(json.dumps({"module": spec.name, "flashinfer": version("flashinfer-python")}), flush=True)


if __name__ == "__main__":
    main()
