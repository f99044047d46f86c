"""The code each probe runs inside a child process of the Python being inspected.

The parent (probes.py) runs this file's text with `python -c SOURCE PROBE [ARG]`, so the target
Python needs neither dflashctl nor anything else installed: this file uses the standard library
only and must stay importable on Python 3.10 (the oldest SGLang supports).

A probe returns plain facts (versions, paths, error text); deciding ok/warn/fail is the parent's
job. The result travels as one JSON object on a private copy of the original stdout; everything the
probed libraries print, from Python or from C, is sent to stderr so it cannot corrupt the result.
"""

import ctypes
import ctypes.util
import importlib
import importlib.metadata as metadata
import json
import os
import sys
import traceback

# What SGLang 0.5.11 imports from each grammar backend at start-up (srt/constrained/*_backend.py).
GRAMMAR_NAMES = {
    "xgrammar": {"xgrammar": ["CompiledGrammar", "GrammarCompiler", "GrammarMatcher", "StructuralTag",
                              "StructuralTagItem", "TokenizerInfo", "allocate_token_bitmask"]},
    "llguidance": {"llguidance": ["LLMatcher", "LLTokenizer", "StructTag", "grammar_from"],
                   "llguidance.hf": ["from_tokenizer"],
                   "llguidance.torch": ["allocate_token_bitmask", "apply_token_bitmask_inplace",
                                        "fill_next_token_bitmask"]},
    "outlines": {"outlines.fsm.guide": ["RegexGuide"],
                 "outlines.models.transformers": ["TransformerTokenizer"]},
}
GRAMMAR_DIST = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines": "outlines"}


def version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def error_text(e):
    return f"{type(e).__name__}: {e}".strip()


def probe_python(_, facts):
    facts.update(version=".".join(map(str, sys.version_info[:3])), executable=sys.executable,
                 implementation=sys.implementation.name, prefix=sys.prefix)


def probe_distributions(_, facts):
    """Every distribution on sys.path; the first one found per name is the one `import` uses."""
    seen, shadowed = {}, []
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = name.lower().replace("_", "-").replace(".", "-")
        location = str(getattr(dist, "_path", "") or "")
        if key in seen:
            shadowed.append({"name": key, "version": dist.version, "location": location})
        else:
            seen[key] = {"version": dist.version, "location": location}
    facts.update(packages=seen, shadowed=shadowed)


def probe_torch(_, facts):
    facts["version"] = version("torch")
    import torch
    facts.update(version=torch.__version__, cuda=torch.version.cuda,
                 cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    facts["gpu_visible"] = bool(torch.cuda.is_available())
    facts["gpus"] = []
    if facts["gpu_visible"]:
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            facts["gpus"].append({"name": torch.cuda.get_device_name(i),
                                  "compute_capability": f"{major}.{minor}"})


def probe_triton(_, facts):
    facts.update({"version": version("triton")})
    import triton
    facts["version"] = getattr(triton, "__version__", facts["version"])


def loaded_libraries(fragment):
    """Paths of shared objects mapped into this process whose path contains `fragment`."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if fragment in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def probe_sgl_kernel(_, facts):
    facts.update({"version": version("sglang-kernel") or version("sgl-kernel")})
    import torch
    cc = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
        cc = f"{major}.{minor}"
    # sgl_kernel's own rule: sm90/ on compute capability 9.0, sm100/ for everything else.
    facts["compute_capability"] = cc
    facts["expected_variant"] = "sm90" if cc == "9.0" else "sm100"
    facts["torch"] = torch.__version__
    import sgl_kernel  # the real test: loads common_ops the way SGLang will
    ops = [p for p in loaded_libraries("common_ops") if "sgl_kernel" in p]
    module = getattr(sgl_kernel, "common_ops", None)
    path = getattr(module, "__file__", None) or (ops[0] if ops else None)
    facts["common_ops"] = path
    facts["variant"] = os.path.basename(os.path.dirname(path)) if path else None


def probe_grammar(backend, facts):
    facts.update({"backend": backend, "version": version(GRAMMAR_DIST[backend]), "missing_names": []})
    for module_name, names in GRAMMAR_NAMES[backend].items():
        module = importlib.import_module(module_name)
        facts["missing_names"] += [f"{module_name}.{n}" for n in names if not hasattr(module, n)]


def probe_flashinfer(_, facts):
    facts.update({"version": version("flashinfer-python"), "cubin_version": version("flashinfer-cubin")})
    files = []
    try:
        files = metadata.files("flashinfer-cubin") or []
    except metadata.PackageNotFoundError:
        pass
    facts["cubins"] = sum(1 for f in files if str(f).endswith(".cubin"))
    import flashinfer
    facts["version"] = getattr(flashinfer, "__version__", facts["version"])


def probe_soundfile(_, facts):
    facts.update({"version": version("soundfile"), "cffi": version("cffi")})
    import soundfile
    facts["libsndfile"] = getattr(soundfile, "__libsndfile_version__", None)


def probe_transformers(_, facts):
    facts.update({"version": version("transformers"), "tokenizers": version("tokenizers")})
    import transformers
    facts["version"] = transformers.__version__


def load_library(name):
    """dlopen by soname as the dynamic loader would for SGLang's extensions; the path it resolved to."""
    lib = ctypes.CDLL(name)
    found = loaded_libraries(name.split(".so")[0] + ".so")
    return lib, (found[0] if found else name)


def probe_native(name, facts):
    facts.update({"soname": name})
    lib, facts["path"] = load_library(name)
    if name == "libcuda.so.1":
        v = ctypes.c_int(0)
        rc = lib.cuDriverGetVersion(ctypes.byref(v))
        facts["cuda_driver_api"] = f"{v.value // 1000}.{v.value % 1000 // 10}" if rc == 0 else None


def probe_driver(_, facts):
    """The driver and its GPUs through NVML, which needs no CUDA runtime and no torch."""
    nvml, _path = load_library("libnvidia-ml.so.1")

    def check(rc, what):
        if rc != 0:
            nvml.nvmlErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {nvml.nvmlErrorString(rc).decode()} (NVML error {rc})")

    check(nvml.nvmlInit_v2(), "nvmlInit")
    buf = ctypes.create_string_buffer(96)
    check(nvml.nvmlSystemGetDriverVersion(buf, 96), "driver version")
    facts.update({"version": buf.value.decode()})
    cuda = ctypes.c_int(0)
    check(nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)), "CUDA version")
    facts["cuda"] = f"{cuda.value // 1000}.{cuda.value % 1000 // 10}"
    count = ctypes.c_uint(0)
    check(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "device count")
    facts["gpus"] = []

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    for i in range(count.value):
        handle = ctypes.c_void_p()
        check(nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)), f"GPU {i}")
        check(nvml.nvmlDeviceGetName(handle, buf, 96), f"GPU {i} name")
        major, minor = ctypes.c_int(), ctypes.c_int()
        check(nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)),
              f"GPU {i} compute capability")
        mem = Memory()
        check(nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)), f"GPU {i} memory")
        facts["gpus"].append({"index": i, "name": buf.value.decode(),
                              "compute_capability": f"{major.value}.{minor.value}",
                              "memory_mib": mem.total // 2**20})
    nvml.nvmlShutdown()


def nvml_snapshot(library):
    """Every GPU's memory, utilization and compute processes, read through NVML at `library` (a
    soname or a path: host/gpus.py passes the one driver discovery found). The answers are plain
    data, so host/gpus.py can save them as a recording and tests can replay them."""
    nvml = ctypes.CDLL(library)
    path = (loaded_libraries("libnvidia-ml") or [library])[0]
    nvml.nvmlErrorString.restype = ctypes.c_char_p

    def call(what, fn, *args):
        rc = fn(*args)
        if rc != 0:
            raise RuntimeError(f"{what}: {nvml.nvmlErrorString(rc).decode()} (NVML error {rc})")

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class Utilization(ctypes.Structure):
        _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

    class Process(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3)
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    def processes(handle):
        fn = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
            nvml.nvmlDeviceGetComputeRunningProcesses_v2
        count, infos = ctypes.c_uint(0), None
        rc = fn(handle, ctypes.byref(count), None)
        while rc == 7:  # NVML_ERROR_INSUFFICIENT_SIZE: count now says how many
            count = ctypes.c_uint(count.value + 4)
            infos = (Process * count.value)()
            rc = fn(handle, ctypes.byref(count), infos)
            if rc == 0:
                break
        if rc != 0:
            raise RuntimeError(f"compute processes: {nvml.nvmlErrorString(rc).decode()} (NVML error {rc})")
        out = []
        for info in (infos[:count.value] if infos is not None else []):
            used = None if info.usedGpuMemory >= 2**64 - 1 else info.usedGpuMemory // 2**20
            out.append({"pid": info.pid, "name": process_name(info.pid), "used_mib": used})
        return out

    def process_name(pid):
        buf = ctypes.create_string_buffer(256)
        if nvml.nvmlSystemGetProcessName(ctypes.c_uint(pid), buf, 256) == 0 and buf.value:
            return buf.value.decode(errors="replace")
        if nested_pid_namespace:  # NVML's pids may be the host's: /proc here could name another process
            return None
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().split(b"\0")[0].decode(errors="replace") or None
        except OSError:
            return None

    try:  # "NSpid: 1234 7" in a container: this process is 7 in its own PID namespace
        with open("/proc/self/status") as f:
            nested_pid_namespace = any(len(line.split()) > 2 for line in f if line.startswith("NSpid:"))
    except OSError:
        nested_pid_namespace = False
    call("nvmlInit", nvml.nvmlInit_v2)
    buf = ctypes.create_string_buffer(96)
    call("driver version", nvml.nvmlSystemGetDriverVersion, buf, 96)
    cuda = ctypes.c_int(0)
    call("CUDA version", nvml.nvmlSystemGetCudaDriverVersion_v2, ctypes.byref(cuda))
    snapshot = {"library": path, "driver": buf.value.decode(), "nested_pid_namespace": nested_pid_namespace,
                "cuda": f"{cuda.value // 1000}.{cuda.value % 1000 // 10}", "gpus": []}
    count = ctypes.c_uint(0)
    call("device count", nvml.nvmlDeviceGetCount_v2, ctypes.byref(count))
    for i in range(count.value):
        handle = ctypes.c_void_p()
        call(f"GPU {i}", nvml.nvmlDeviceGetHandleByIndex_v2, i, ctypes.byref(handle))
        gpu = {"index": i}
        call(f"GPU {i} name", nvml.nvmlDeviceGetName, handle, buf, 96)
        gpu["name"] = buf.value.decode()
        call(f"GPU {i} UUID", nvml.nvmlDeviceGetUUID, handle, buf, 96)
        gpu["uuid"] = buf.value.decode()
        major, minor = ctypes.c_int(), ctypes.c_int()  # which prebuilt kernels fit it (smoke's prewarm)
        if nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) == 0:
            gpu["compute_capability"] = f"{major.value}.{minor.value}"
        mem = Memory()
        call(f"GPU {i} memory", nvml.nvmlDeviceGetMemoryInfo, handle, ctypes.byref(mem))
        gpu["memory_mib"] = {"total": mem.total // 2**20, "free": mem.free // 2**20, "used": mem.used // 2**20}
        util = Utilization()  # not supported on every GPU (MIG): None, not a failure
        ok = nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) == 0
        gpu["utilization_percent"] = {"gpu": util.gpu, "memory": util.memory} if ok else None
        try:
            gpu["processes"] = processes(handle)
        except RuntimeError as e:
            gpu["processes"], gpu["processes_error"] = None, str(e)
        snapshot["gpus"].append(gpu)
    nvml.nvmlShutdown()
    return snapshot


def probe_gpus(library, facts):
    facts.update(nvml_snapshot(library or "libnvidia-ml.so.1"))


def probe_sglang(algorithm, facts):
    """Where sglang is and the choices its parser offers, read from source with `ast`.

    Importing sglang.srt.server_args costs ~20 s (it pulls in torch and most of SGLang), which a
    preflight cannot afford; SGLang's own start imports it seconds later anyway.
    """
    import ast
    import importlib.util
    facts["version"] = version("sglang")
    facts["algorithm"] = algorithm or None
    spec = importlib.util.find_spec("sglang")  # a top-level find_spec executes nothing
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'sglang'")
    path = os.path.join(list(spec.submodule_search_locations)[0], "srt", "server_args.py")
    facts["server_args"] = path
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    assigned = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}

    def strings(node):
        node = assigned.get(node.id, node) if isinstance(node, ast.Name) else node
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return None

    choices = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
            for kw in node.keywords:
                if kw.arg == "choices" and flags:
                    choices[flags[0]] = strings(kw.value)
    facts["speculative_algorithms"] = choices.get("--speculative-algorithm") or []
    facts["grammar_backends"] = choices.get("--grammar-backend") or []


def probe_cuda_toolkit(_, facts):
    """The stack's own CUDA toolkit: site-packages/nvidia/cu13 with bin/nvcc (the locked
    nvidia-cuda-nvcc wheel), found without importing anything."""
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    facts["searched"] = roots
    # every cu13 tree: headers and libraries of one stack can sit in several roots (a venv plus
    # PYTHONPATH); the one with nvcc comes first
    facts["cu13_roots"] = [os.path.join(r, "cu13") for r in roots if os.path.isdir(os.path.join(r, "cu13"))]
    for root in roots:
        cu13 = os.path.join(root, "cu13")
        if os.access(os.path.join(cu13, "bin", "nvcc"), os.X_OK):
            facts["cu13"] = cu13
            facts["nvcc_version"] = version("nvidia-cuda-nvcc")
            return
    raise FileNotFoundError("no nvidia/cu13/bin/nvcc in " + (", ".join(roots) or "any nvidia package"))


def bytecode_is_current(source):
    """Would this interpreter load `source` from its byte code instead of compiling it? The .pyc
    where the import system looks (cache_from_source), with this interpreter's magic number, and
    either the source's mtime and size (timestamp mode) or its hash (checked-hash mode, as Nix
    builds write it; unchecked: current by definition)."""
    import importlib.util
    try:
        with open(importlib.util.cache_from_source(source), "rb") as f:
            header = f.read(16)
    except (OSError, NotImplementedError, ValueError):
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(header[4:8], "little")
    try:
        if flags & 0b1:  # hash-based
            if not flags & 0b10:
                return True
            with open(source, "rb") as f:
                return importlib.util.source_hash(f.read()) == header[8:16]
        st = os.stat(source)
    except OSError:
        return False
    return (int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)


def probe_bytecode(names, facts):
    """For each top-level package in `names` (comma-separated): its modules, how many of them have
    current byte code, whether its directory is writable. Reads files only: nothing is imported."""
    import importlib.util
    facts.update(dont_write_bytecode=bool(sys.flags.dont_write_bytecode), pycache_prefix=sys.pycache_prefix,
                 packages={})
    for name in filter(None, names.split(",")):
        spec = importlib.util.find_spec(name)  # a top-level name: no package code runs
        if spec is None or not spec.submodule_search_locations:
            continue
        root = list(spec.submodule_search_locations)[0]
        modules = current = 0
        for directory, _, files in os.walk(root):
            for file in files:
                if file.endswith(".py"):
                    modules += 1
                    current += bytecode_is_current(os.path.join(directory, file))
        facts["packages"][name] = {"path": root, "modules": modules, "current": current,
                                   "writable": os.access(root, os.W_OK)}


def probe_crash(_, facts):  # used by the tests: a native crash, as a broken extension would cause
    os.abort()


def probe_hang(_, facts):  # used by the tests: an import that never returns
    import time
    time.sleep(3600)


def main():
    # The result goes to a private duplicate of stdout; fd 1 becomes stderr for everything else.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if sys.path and sys.path[0] == "":
        sys.path.pop(0)  # `-c` puts the working directory first; it must not shadow real packages
    name, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
    facts = {}  # filled as the probe goes: what it learnt before failing is kept
    try:
        globals()[f"probe_{name}"](arg, facts)
        result = {"ok": True, "facts": facts}
    except BaseException as e:  # noqa: BLE001 - any failure is a finding, reported as such
        tb = traceback.extract_tb(e.__traceback__)
        result = {"ok": False, "facts": facts, "error": error_text(e),
                  "where": f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""}
    with os.fdopen(result_fd, "w") as out:
        out.write(json.dumps(result, default=str))
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: some native libraries crash or hang at exit


if __name__ == "__main__":
    main()
