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
import time
import traceback

# What SGLang 0.5.11 imports from each grammar backend at start-up (srt/constrained/*_backend.py);
# the rest of dflashctl reads it as host/sglang_0_5_11.GRAMMAR_IMPORTS (this file runs alone).
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
RESULT_FD = 1  # main() points it at the private copy of stdout the result goes to


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


# ------------------------------------------------------------------------------------------ NVML
# The one NVML reader: doctor's driver and gpus probes, serve's preflight, the stall detector and the
# GPU watch while serving all read the driver through it. A figure keeps NVML's return code with its
# value, so a GPU that lacks one, or has fallen off the bus, is a fact and not an exception.

NVML_ERRORS = {0: "SUCCESS", 1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
               7: "INSUFFICIENT_SIZE", 9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 13: "FUNCTION_NOT_FOUND",
               15: "GPU_IS_LOST", 16: "RESET_REQUIRED", 999: "UNKNOWN"}
INSUFFICIENT_SIZE, TIMEOUT, FUNCTION_NOT_FOUND = 7, 10, 13
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError (nvml.h)
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: none / reset / reboot / drain


class PciInfo(ctypes.Structure):  # nvmlPciInfo_t
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class FieldValue(ctypes.Structure):  # nvmlFieldValue_t; `value` is the nvmlValue_t union's widest member
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]


class EventData(ctypes.Structure):  # nvmlEventData_t
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Process(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    """libnvidia-ml at `library` (a soname or a path: host/gpus.py passes the one driver discovery
    found). `call` returns NVML's code; a function this library lacks is FUNCTION_NOT_FOUND."""

    def __init__(self, library):
        self.lib = ctypes.CDLL(library)
        self.path = (loaded_libraries("libnvidia-ml") or [library])[0]
        self.lib.nvmlErrorString.restype = ctypes.c_char_p

    def call(self, name, *args):
        fn = getattr(self.lib, name, None)
        return FUNCTION_NOT_FOUND if fn is None else fn(*args)

    def newest(self, names, *args):
        """The first of `names` (newest API first) this library has."""
        for name in names:
            if getattr(self.lib, name, None) is not None:
                return self.call(name, *args)
        return FUNCTION_NOT_FOUND

    def error(self, rc):
        text = self.lib.nvmlErrorString(rc)
        return f"{text.decode() if text else NVML_ERRORS.get(rc, 'Unknown Error')} (NVML error {rc})"

    def check(self, what, name, *args):
        rc = self.call(name, *args)
        if rc != 0:
            raise RuntimeError(f"{what}: {self.error(rc)}")

    def text(self, name, handle, size=96):
        buf = ctypes.create_string_buffer(size)
        rc = self.call(name, handle, buf, size)
        return rc, buf.value.decode(errors="replace")


def figure(rc, value=None):
    """One NVML answer: {"rc": 0, "value": ...}, or {"rc": N, "error": NAME} when it gave none."""
    return {"rc": 0, "value": value} if rc == 0 else {"rc": rc, "error": NVML_ERRORS.get(rc, str(rc))}


def read_health(nvml, handle):
    """Every figure a GPU health check reads, each with its return code, in the shape of
    tests/data/gpus/h200-health.json (benchmarks/gpu/nvml_health.py). Masks are hex strings."""
    ref, uint, ull = ctypes.byref, ctypes.c_uint, ctypes.c_ulonglong
    health = {}
    pci = PciInfo()
    rc = nvml.newest(("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"), handle, ref(pci))
    health["pci"] = figure(rc, {"busId": pci.busId.decode(errors="replace"), "pciDeviceId": hex(pci.pciDeviceId)})
    current, pending = uint(), uint()
    rc = nvml.call("nvmlDeviceGetEccMode", handle, ref(current), ref(pending))
    health["ecc_mode"] = figure(rc, {"current": current.value, "pending": pending.value})
    health["ecc_errors"] = {}
    for kind, kind_name in ((0, "corrected"), (1, "uncorrected")):  # nvmlMemoryErrorType_t
        for counter, counter_name in ((0, "volatile"), (1, "aggregate")):  # nvmlEccCounterType_t
            n = ull()
            rc = nvml.call("nvmlDeviceGetTotalEccErrors", handle, kind, counter, ref(n))
            health["ecc_errors"][f"{kind_name}_{counter_name}"] = figure(rc, n.value)
    rows = [uint() for _ in range(4)]
    rc = nvml.call("nvmlDeviceGetRemappedRows", handle, *(ref(r) for r in rows))
    health["remapped_rows"] = figure(rc, dict(zip(("correctable", "uncorrectable", "pending", "failure"),
                                                  (r.value for r in rows))))
    health["retired_pages"] = {}
    for cause, cause_name in ((0, "multiple_single_bit"), (1, "double_bit")):  # nvmlPageRetirementCause_t
        n = uint(0)  # a size query: INSUFFICIENT_SIZE only says that there are pages
        rc = nvml.call("nvmlDeviceGetRetiredPages", handle, cause, ref(n), None)
        health["retired_pages"][cause_name] = figure(0 if rc == INSUFFICIENT_SIZE else rc, n.value)
    flag = uint()
    health["retired_pages_pending"] = figure(nvml.call("nvmlDeviceGetRetiredPagesPendingStatus", handle,
                                                       ref(flag)), flag.value)
    for key, names in (("clock_event_reasons", ("nvmlDeviceGetCurrentClocksEventReasons",
                                                "nvmlDeviceGetCurrentClocksThrottleReasons")),
                       ("clock_event_reasons_supported", ("nvmlDeviceGetSupportedClocksEventReasons",
                                                          "nvmlDeviceGetSupportedClocksThrottleReasons"))):
        mask = ull()
        health[key] = figure(nvml.newest(names, handle, ref(mask)), hex(mask.value))
    health["pcie"] = {}
    for key, name in (("gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
                      ("gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                      ("gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
                      ("width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
                      ("width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
        v = uint()
        health["pcie"][key] = figure(nvml.call(name, handle, ref(v)), v.value)
    t, p = uint(), uint()
    health["temperature_c"] = figure(nvml.call("nvmlDeviceGetTemperature", handle, 0, ref(t)), t.value)
    health["power_mw"] = figure(nvml.call("nvmlDeviceGetPowerUsage", handle, ref(p)), p.value)
    health["recovery_action"] = recovery_action(nvml, handle)
    return health


def recovery_action(nvml, handle):
    """What the driver says the GPU needs (0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset)."""
    value = FieldValue(fieldId=RECOVERY_ACTION_FIELD)
    rc = nvml.call("nvmlDeviceGetFieldValues", handle, 1, ctypes.byref(value))
    rc = rc or value.nvmlReturn
    width = {1: 0xFFFFFFFF, 5: 0xFFFFFFFF, 6: 0xFFFF}.get(value.valueType, 2**64 - 1)  # uint, int, ushort
    return figure(rc, value.value & width)


def watch_figures(nvml, handle):
    """What the GPU watch reads each second: the figures whose change ends an instance."""
    ref, uint, ull = ctypes.byref, ctypes.c_uint, ctypes.c_ulonglong
    n = ull()
    rc = nvml.call("nvmlDeviceGetTotalEccErrors", handle, 1, 0, ref(n))
    out = {"ecc_errors": {"uncorrected_volatile": figure(rc, n.value)}}
    rows = [uint() for _ in range(4)]
    rc = nvml.call("nvmlDeviceGetRemappedRows", handle, *(ref(r) for r in rows))
    out["remapped_rows"] = figure(rc, dict(zip(("correctable", "uncorrectable", "pending", "failure"),
                                               (r.value for r in rows))))
    out["recovery_action"] = recovery_action(nvml, handle)
    return out


def gpu_processes(nvml, handle, nested_pid_namespace):
    fn = "nvmlDeviceGetComputeRunningProcesses_v3"
    if getattr(nvml.lib, fn, None) is None:
        fn = "nvmlDeviceGetComputeRunningProcesses_v2"
    count, infos = ctypes.c_uint(0), None
    rc = nvml.call(fn, handle, ctypes.byref(count), None)
    while rc == INSUFFICIENT_SIZE:  # count now says how many
        count = ctypes.c_uint(count.value + 4)
        infos = (Process * count.value)()
        rc = nvml.call(fn, handle, ctypes.byref(count), infos)
    if rc != 0:
        raise RuntimeError(f"compute processes: {nvml.error(rc)}")
    out = []
    for info in (infos[:count.value] if infos is not None else []):
        used = None if info.usedGpuMemory >= 2**64 - 1 else info.usedGpuMemory // 2**20
        out.append({"pid": info.pid, "name": process_name(nvml, info.pid, nested_pid_namespace), "used_mib": used})
    return out


def process_name(nvml, pid, nested_pid_namespace):
    buf = ctypes.create_string_buffer(256)
    if nvml.call("nvmlSystemGetProcessName", ctypes.c_uint(pid), buf, 256) == 0 and buf.value:
        return buf.value.decode(errors="replace")
    if nested_pid_namespace:  # NVML's pids may be the host's: /proc here could name another process
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace") or None
    except OSError:
        return None


def open_nvml(library):
    nvml = Nvml(library)
    nvml.check("nvmlInit", "nvmlInit_v2")
    return nvml


def gpu_handle(nvml, i):
    """NVML's code and the handle of GPU `i`."""
    handle = ctypes.c_void_p()
    return nvml.call("nvmlDeviceGetHandleByIndex_v2", i, ctypes.byref(handle)), handle


def identity(nvml, i, handle):
    """{"index", "name", "uuid"} of a GPU, and (key, code) of the first that NVML did not give (None
    when both came): its name stays None, the uuid is not asked for."""
    gpu = {"index": i}
    for key, name in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
        rc, gpu[key] = nvml.text(name, handle)
        if rc != 0:
            gpu[key] = None
            return gpu, (key, rc)
    return gpu, None


def read_gpu(nvml, i, nested_pid_namespace):
    """One GPU: identity, memory, utilization, compute processes, health. A GPU that does not answer
    (lost: NVML_ERROR_GPU_IS_LOST) comes back with its return code and error instead of memory."""
    rc, handle = gpu_handle(nvml, i)
    if rc != 0:
        return {"index": i, "rc": rc, "error": f"GPU {i}: {nvml.error(rc)}"}
    gpu, failed = identity(nvml, i, handle)
    if failed:
        key, rc = failed
        return dict(gpu, rc=rc, error=f"GPU {i} {key}: {nvml.error(rc)}", health=read_health(nvml, handle))
    major, minor = ctypes.c_int(), ctypes.c_int()  # which prebuilt kernels fit it (smoke's prewarm)
    if nvml.call("nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor)) == 0:
        gpu["compute_capability"] = f"{major.value}.{minor.value}"
    mem = Memory()
    rc = nvml.call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(mem))
    if rc != 0:
        return dict(gpu, rc=rc, error=f"GPU {i} memory: {nvml.error(rc)}", health=read_health(nvml, handle))
    gpu["memory_mib"] = {"total": mem.total // 2**20, "free": mem.free // 2**20, "used": mem.used // 2**20}
    util = Utilization()  # not supported on every GPU (MIG): None, not a failure
    ok = nvml.call("nvmlDeviceGetUtilizationRates", handle, ctypes.byref(util)) == 0
    gpu["utilization_percent"] = {"gpu": util.gpu, "memory": util.memory} if ok else None
    try:
        gpu["processes"] = gpu_processes(nvml, handle, nested_pid_namespace)
    except RuntimeError as e:
        gpu["processes"], gpu["processes_error"] = None, str(e)
    gpu["health"] = read_health(nvml, handle)
    return gpu


def in_nested_pid_namespace():
    try:  # "NSpid: 1234 7" in a container: this process is 7 in its own PID namespace
        with open("/proc/self/status") as f:
            return any(len(line.split()) > 2 for line in f if line.startswith("NSpid:"))
    except OSError:
        return False


def nvml_snapshot(library):
    """Every GPU's identity, memory, utilization, compute processes and health figures, read through
    NVML at `library`. GPUs that do not answer are listed under `unanswered`, with NVML's code, so
    the others are still reported. The answers are plain data: host/gpus.py saves them as a
    recording and tests replay them."""
    nested = in_nested_pid_namespace()
    nvml = open_nvml(library)
    buf = ctypes.create_string_buffer(96)
    nvml.check("driver version", "nvmlSystemGetDriverVersion", buf, 96)
    cuda = ctypes.c_int(0)
    nvml.check("CUDA version", "nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(cuda))
    count = ctypes.c_uint(0)
    nvml.check("device count", "nvmlDeviceGetCount_v2", ctypes.byref(count))
    snapshot = {"library": nvml.path, "driver": buf.value.decode(), "nested_pid_namespace": nested,
                "cuda": f"{cuda.value // 1000}.{cuda.value % 1000 // 10}", "count": count.value,
                "gpus": [], "unanswered": []}
    for i in range(count.value):
        gpu = read_gpu(nvml, i, nested)
        snapshot["unanswered" if "rc" in gpu else "gpus"].append(gpu)
    nvml.call("nvmlShutdown")
    return snapshot


def probe_driver(_, facts):
    """The driver and its GPUs through NVML, which needs no CUDA runtime and no torch. A GPU that
    does not answer is named under `unanswered`; the driver and the other GPUs are still reported."""
    snap = nvml_snapshot("libnvidia-ml.so.1")  # by soname, as the dynamic loader finds it for CUDA
    facts.update(version=snap["driver"], cuda=snap["cuda"], unanswered=snap["unanswered"])
    facts["gpus"] = [{"index": g["index"], "name": g["name"], "compute_capability": g.get("compute_capability"),
                      "memory_mib": g["memory_mib"]["total"]} for g in snap["gpus"]]


def probe_gpus(library, facts):
    facts.update(nvml_snapshot(library or "libnvidia-ml.so.1"))


def emit(event):
    """One line on the result stream (probe_gpu_watch): flushed at once, the parent reads it live."""
    os.write(RESULT_FD, (json.dumps(event, default=str) + "\n").encode())


def probe_gpu_watch(arg, facts):
    """Watch GPUs while an instance serves, until killed: `arg` is "INDICES;POLL_S" ("0,1;1.0").
    One thread blocks in nvmlEventSetWait_v2 on a critical-XID event set, waking at least every
    POLL_S seconds to read each GPU's watch figures; every XID, every change of a figure and a GPU
    that stops answering is written as one JSON line (the parent decides what they mean). Reads
    cost about 0.05 ms per GPU (tests/data/gpus/h200-health.json); nothing touches CUDA."""
    indices_text, _, poll_text = arg.partition(";")
    indices = [int(i) for i in indices_text.split(",") if i.strip()]
    poll_ms = max(100, int(float(poll_text or "1.0") * 1000))
    die_with_parent()
    parent = os.getppid()
    nvml = open_nvml("libnvidia-ml.so.1")
    handles, by_handle, last = {}, {}, {}
    event_set = ctypes.c_void_p()
    set_rc = nvml.call("nvmlEventSetCreate", ctypes.byref(event_set))
    start = {"event": "start", "poll_ms": poll_ms, "event_set": figure(set_rc), "gpus": []}
    for i in indices:
        rc, handle = gpu_handle(nvml, i)
        entry = {"index": i, "handle": figure(rc)}
        if rc == 0:
            handles[i], by_handle[handle.value] = handle, i
            entry.update(identity(nvml, i, handle)[0])
            entry["health"] = read_health(nvml, handle)  # its PCI bus id names it; its figures, for the log
            entry["xid_events"] = figure(nvml.call("nvmlDeviceRegisterEvents", handle,
                                                   ctypes.c_ulonglong(XID_CRITICAL), event_set)
                                         if set_rc == 0 else set_rc)
            last[i] = watch_figures(nvml, handle)
            entry["figures"] = last[i]
        start["gpus"].append(entry)
    emit(start)
    data, wait_rc = EventData(), TIMEOUT
    while os.getppid() == parent:
        if set_rc == 0:
            rc = nvml.call("nvmlEventSetWait_v2", event_set, ctypes.byref(data), poll_ms)
        else:  # no event set: a poll alone, as often
            time.sleep(poll_ms / 1000)
            rc = TIMEOUT
        if rc == 0:
            emit({"event": "xid", "index": by_handle.get(data.device), "xid": data.eventData,
                  "event_type": hex(data.eventType)})
        elif rc != TIMEOUT:  # GPU_IS_LOST once a GPU fell off: the poll below names which one
            if rc != wait_rc:
                emit({"event": "wait", "rc": rc, "error": nvml.error(rc)})
            time.sleep(poll_ms / 1000)  # a wait that fails at once must not spin
        wait_rc = rc
        for i, handle in handles.items():
            now = watch_figures(nvml, handle)
            if now != last[i]:
                emit({"event": "figures", "index": i, "figures": now})
                last[i] = now


def die_with_parent():
    """The watch must not outlive serve (SIGKILLed, it cannot stop us): PR_SET_PDEATHSIG on Linux,
    which fires when the thread that started this process ends (serve's main thread)."""
    try:
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass  # the getppid() check in the loop still ends it within a poll


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


def probe_faststart(arg, facts):
    """The fast start tried once in this interpreter (kernel_hook/dflash_faststart.self_check): a
    template importing the preload list, one child forked from it, whether the child is this
    process's own, in its group. `arg`: JSON [the hook's directory, the preload list's path]."""
    hook_dir, preload_list = json.loads(arg)
    sys.path.insert(0, hook_dir)
    import dflash_faststart
    facts.update(dflash_faststart.self_check(preload_list))


def probe_crash(_, facts):  # used by the tests: a native crash, as a broken extension would cause
    os.abort()


def probe_hang(_, facts):  # used by the tests: an import that never returns
    time.sleep(3600)


def main():
    # The result goes to a private duplicate of stdout; fd 1 becomes stderr for everything else.
    global RESULT_FD
    result_fd = RESULT_FD = os.dup(1)
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
