"""Recorded Triton kernels compiled without a GPU, run inside the stack's interpreter by
host/triton_kernels.py (which says what a record is and why a key must match).

`python -c SOURCE RECORDS_JSON STUB_DIR WITH_CUDA_UTILS`: compiles each record of the JSON file into
$TRITON_CACHE_DIR (set by the parent) with Triton's own compiler, with the C launcher Triton would
build at the first start, linked against STUB_DIR's empty libcuda.so.1; WITH_CUDA_UTILS=1 also
builds Triton's cuda_utils (one child of a build does). One JSON line on stdout: a list of results,
{"kernel", "hash", "ok", "stale"?, "carried"?, "error"?} and {"helper", "ok", "error"?}.
Standard library and Triton (plus the modules that define the kernels) only.
"""

import importlib
import json
import os
import sys


def decode(v, tl):
    """A recorded constant back into Triton's value (dtypes, constexprs, JIT functions, tuples)."""
    if isinstance(v, dict):
        if "dtype" in v:
            return tl.dtype(v["dtype"])
        if "constexpr" in v:
            return tl.constexpr(decode(v["constexpr"], tl))
        if "jit" in v:
            return resolve(*v["jit"])
        if "tuple" in v:
            return tuple(decode(x, tl) for x in v["tuple"])
    return v


def tuples(v):
    return tuple(tuples(x) for x in v) if isinstance(v, list) else v


def resolve(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while type(obj).__name__ != "JITFunction" and hasattr(obj, "fn"):
        obj = obj.fn  # autotune / heuristics wrappers
    return obj


def helper(src, name, stub):
    """One of Triton's C helper modules. It is linked against the driver; loading it needs one, and
    this build has none."""
    from triton.backends.nvidia import driver as nv
    from triton.runtime.build import compile_module_from_src
    try:
        compile_module_from_src(src, name, library_dirs=[nv.libdevice_dir, stub],
                                include_dirs=nv.include_dirs, libraries=nv.libraries)
    except ImportError:
        pass


def carried_options(options, source):
    """Triton derives some options from the target (the arch, max_num_imprecise_acc_default, the fp8
    types): keep only those the launch chose, as the runtime passes them to parse_options."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    defaults = make_backend(GPUTarget("cuda", source, 32)).parse_options({}).__dict__
    return {k: v for k, v in options.items() if k not in defaults or tuples(v) != defaults[k]}


def compile_record(r, stub):
    """One record compiled and its launcher built; its result."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import driver as nv
    from triton.compiler.compiler import ASTSource, make_backend
    out = {"kernel": f"{r['module']}.{r['qualname']}", "hash": r["hash"], "ok": False}
    fn = resolve(r["module"], r["qualname"])
    if fn.cache_key != r["fn_key"]:
        return dict(out, stale=True, error="its source differs from the recorded one (another SGLang or Triton)")
    t = r["target"]
    target = GPUTarget(t["backend"], t["arch"], t["warp_size"])
    recorded = dict(r["signature"])
    signature = {k: tuples(recorded[k]) for k in fn.arg_names}  # the launcher takes them in this order
    constants = {tuple(k): decode(v, tl) for k, v in r["constants"]}
    attrs = {tuple(k): v for k, v in r["attrs"]}
    options = {k: tuples(v) for k, v in r["options"].items()}
    if r.get("carried_from"):
        options = carried_options(options, r["carried_from"]["arch"])
    src = ASTSource(fn, signature, constants, attrs)
    kernel = triton.compile(src, target=target, options=make_backend(target).parse_options(options).__dict__)
    if r.get("carried_from"):
        out.update(hash=kernel.hash, carried=True)  # no GPU of this arch recorded it: Triton's key is the one
    elif kernel.hash != r["hash"]:
        return dict(out, stale=True, error=f"built under key {kernel.hash[:12]}, recorded {r['hash'][:12]}: "
                    "Triton's options or compiler differ here")
    by_index = {(fn.arg_names.index(k),) if isinstance(k, str) else k: v for k, v in src.constants.items()}
    helper(nv.make_launcher(by_index, signature, getattr(kernel.metadata, "tensordesc_meta", None)),
           "__triton_launcher", stub)
    return dict(out, ok=True)


def main():
    with open(sys.argv[1]) as f:
        records = json.load(f)
    stub, with_cuda_utils = sys.argv[2], sys.argv[3] == "1"
    from triton.backends.nvidia import driver as nv
    results = []
    if with_cuda_utils:
        try:
            with open(os.path.join(nv.dirname, "driver.c")) as f:
                helper(f.read(), "cuda_utils", stub)
            results.append({"helper": "cuda_utils", "ok": True})
        except Exception as e:  # noqa: BLE001 - reported as a result
            results.append({"helper": "cuda_utils", "ok": False, "error": f"{type(e).__name__}: {e}"})
    for r in records:
        try:
            results.append(compile_record(r, stub))
        except Exception as e:  # noqa: BLE001 - reported as a result
            results.append({"kernel": f"{r['module']}.{r['qualname']}", "hash": r["hash"], "ok": False,
                            "error": f"{type(e).__name__}: {str(e)[:500]}"})
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
