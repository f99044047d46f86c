"""The story's two hosts as real virtual environments, built in a second from small stand-ins.

Host A has the locked stack's versions; host B has what the story's second host had: torch built for
CUDA 12.8, an sgl_kernel whose common_ops was linked against another torch build (loading it fails
in the dynamic loader with `undefined symbol: _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb`),
xgrammar 0.1.10 without StructuralTag, and no soundfile.

Each package is a stand-in with real metadata (a .dist-info), so importlib.metadata, pip and doctor
see the versions a real install would. The two native pieces are real shared libraries compiled
here with gcc: torch's libc10_cuda.so (exporting the C++ symbol of one torch build) and
sgl_kernel's common_ops (needing the symbol of another), loaded with RTLD_NOW as Python loads an
extension, so the failure is the dynamic loader's own.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_SGLANG = REPO / "tests" / "data" / "smoke" / "fake_sglang" / "sglang"

# c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool): what
# sglang-kernel 0.4.2 needs from torch 2.11.0. The other build exports it with an int line number.
NEEDED = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"
DEMANGLED = "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool)"
OTHER_BUILD = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib"

XGRAMMAR_NAMES = ["CompiledGrammar", "GrammarCompiler", "GrammarMatcher", "TokenizerInfo",
                  "allocate_token_bitmask"]
HOSTS = {
    "A": {"torch": ("2.11.0+cu130", "13.0", NEEDED), "xgrammar": ("0.1.32", ["StructuralTag", "StructuralTagItem"]),
          "soundfile": "0.13.1"},
    "B": {"torch": ("2.9.1+cu128", "12.8", OTHER_BUILD), "xgrammar": ("0.1.10", []), "soundfile": None},
}

TORCH = '''"""Stand-in torch {version}: loads its C++ library globally, as torch does, and reports one GPU."""
import ctypes
import os
import types

ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libc10_cuda.so"), mode=ctypes.RTLD_GLOBAL)
__version__ = "{version}"
version = types.SimpleNamespace(cuda="{cuda}")
_C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
                             get_device_capability=lambda i=0: (9, 0),
                             get_device_name=lambda i=0: "NVIDIA H200 (stand-in)")
'''

# sgl_kernel 0.4.2's loader, reduced: sm90/ on compute capability 9.0, sm100/ otherwise; every
# failed attempt is listed at the end of one long ImportError, as the real one does.
SGL_KERNEL = '''import ctypes
import glob
import os
import types

import torch

_cc = torch.cuda.get_device_capability(torch.cuda.current_device()) if torch.cuda.is_available() else None
_variant = "sm90" if _cc == (9, 0) else "sm100"
_pattern = os.path.join(os.path.dirname(__file__), _variant, "common_ops.*")
_errors = []
for _path in sorted(glob.glob(_pattern)):
    try:
        ctypes.CDLL(_path)  # RTLD_NOW, like Python's extension loader: undefined symbols fail here
        common_ops = types.SimpleNamespace(__file__=_path)
        break
    except OSError as e:
        _errors.append(ImportError(str(e)))
else:
    _errors.append(ModuleNotFoundError("No module named 'common_ops'"))
    _details = "\\n".join(f"- {type(e).__name__}: {e}" for e in _errors)
    raise ImportError(f"""
[sgl_kernel] CRITICAL: Could not load any common_ops library!

Attempted locations:
1. Architecture-specific pattern: {_pattern}
2. Standard Python import: common_ops - failed

GPU Info:
- Compute capability: {_cc}

Please ensure sgl_kernel is properly installed with:
pip install --upgrade sgl_kernel

Error details from previous import attempts:
{_details}
""")
'''


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def dist_info(site: Path, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "INSTALLER").write_text("storyhosts\n")


def gcc(source: str, out: Path, *flags: str) -> None:
    c = out.with_suffix(".c")
    c.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(c), *flags], check=True)
    c.unlink()


def build_host(root: Path, name: str) -> Path:
    """A venv at root/name with host `name`'s packages; its python."""
    spec = HOSTS[name]
    venv = root / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = site_packages(venv)
    torch_version, cuda, exported = spec["torch"]
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(TORCH.format(version=torch_version, cuda=cuda))
    gcc(f"void {exported}(void) {{}}\n", site / "torch" / "lib" / "libc10_cuda.so")
    dist_info(site, "torch", torch_version)
    (site / "sgl_kernel" / "sm90").mkdir(parents=True)
    (site / "sgl_kernel" / "__init__.py").write_text(SGL_KERNEL)
    gcc(f"extern void {NEEDED}(void);\nvoid sgl_kernel_common_ops(void) {{ {NEEDED}(); }}\n",
        site / "sgl_kernel" / "sm90" / "common_ops.abi3.so")
    dist_info(site, "sglang-kernel", "0.4.2")
    version, extra = spec["xgrammar"]
    (site / "xgrammar").mkdir()
    (site / "xgrammar" / "__init__.py").write_text(
        "".join(f"class {n}:\n    pass\n\n\n" for n in XGRAMMAR_NAMES + extra))
    dist_info(site, "xgrammar", version)
    if spec["soundfile"]:
        (site / "soundfile.py").write_text('__libsndfile_version__ = "1.2.2"\n')
        dist_info(site, "soundfile", spec["soundfile"])
        dist_info(site, "cffi", "2.1.1")
    shutil.copytree(FAKE_SGLANG, site / "sglang")
    dist_info(site, "sglang", "0.5.11")
    (site / "triton").mkdir()
    (site / "triton" / "__init__.py").write_text('__version__ = "3.6.0"\n')
    dist_info(site, "triton", "3.6.0")
    (site / "transformers").mkdir()
    (site / "transformers" / "__init__.py").write_text('__version__ = "5.6.0"\n')
    dist_info(site, "transformers", "5.6.0")
    dist_info(site, "tokenizers", "0.22.2")
    return venv / "bin" / "python"


def lock_from(python: Path, path: Path) -> Path:
    """A lock for this system whose packages are exactly host A's: what a correct host has."""
    from dflashctl.lock.lockfile import canonical_name
    from dflashctl.systems import current_system
    listing = subprocess.run([str(python), "-c", "import importlib.metadata as m, json; print(json.dumps("
                              "{d.metadata['Name']: d.version for d in m.distributions()}))"],
                             check=True, capture_output=True, text=True).stdout
    pkgs = {canonical_name(n): {"version": v.split("+")[0], "file": f"{n}-{v.split('+')[0]}-py3-none-any.whl",
                                "size": 1, "sha256": "0" * 64, "dependencies": []}
            for n, v in json.loads(listing).items()}
    lock = {"version": 1, "spec_sha256": "0" * 64, "python": "%d.%d" % sys.version_info[:2],
            "exclude_newer": "2026-05-08T00:00:00Z", "requirements": [],
            "systems": {current_system(): {"roots": ["sglang"], "packages": pkgs}}}
    path.write_text(json.dumps(lock))
    return path
