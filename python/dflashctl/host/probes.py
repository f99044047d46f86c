"""Probes of a Python environment, each in its own child process: what `doctor` and `serve` check.

A probe that imports native code can crash (abort, segfault) or hang (a driver call that never
returns); run in a child of the *target* Python with a timeout, either becomes a failing Check with
the tail of the child's stderr, never the end of the parent. The children all run at once (bounded
by memory, not cores), so the whole set costs about as long as the slowest import (`import torch`),
and a hung interpreter costs one timeout, not one per batch.

`run_probes` returns raw facts (probe_child.py gathers them); the `check_*` functions below turn
them into Checks: status, one-line summary, one-line fix, and the exit code `serve` exits with.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflashctl import errors
from dflashctl.host import sglang_0_5_11, symbols

CHILD_SOURCE = (Path(__file__).with_name("probe_child.py")).read_text()
MIN_DRIVER = 580  # CUDA 13.0 needs a driver >= 580 (CUDA 13.0 release notes, Linux)
CUDA_LINE = "13"  # torch 2.11.0 from the index is the CUDA 13.0 build; sgl_kernel links *.so.13
STDERR_TAIL_LINES = 12
LOCKED = "install the locked wheel"
NIX_INSTALL = "nix profile install .#dflash-env"
INSTALL_STACK = ("install the locked stack into this environment: `dflashctl export -o /tmp/dflash-requirements.txt "
                 "&& python -m pip install --no-deps --require-hashes -r /tmp/dflash-requirements.txt`, "
                 f"or with Nix `{NIX_INSTALL}`")


@dataclass(frozen=True)
class Stack:
    """What the fixes name: the locked versions and how to install them (from the lock when known).

    The versions come from the lock only (nix/stack.toml -> nix/python-lock.json): without a lock
    a fix says "the version the lock pins" rather than a number that could be stale.
    """

    pins: dict = field(default_factory=dict)  # canonical name -> locked version
    install: str = INSTALL_STACK

    def wheel(self, name: str) -> str:
        return f"{name} {self.pins[name]}" if self.pins.get(name) else f"the {name} version the lock pins"


NO_LOCK = Stack()


@dataclass
class Check:
    name: str
    status: str  # 'ok' | 'warn' | 'fail'
    summary: str
    fix: str = ""
    exit_code: int = 0  # an errors.PREFLIGHT_* code (or errors.FAILED) when status is 'fail'
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def ok(name, summary, **details) -> Check:
    return Check(name, "ok", summary, details=details)


def warn(name, summary, fix, **details) -> Check:
    return Check(name, "warn", summary, fix, 0, details)


def fail(name, summary, fix, code, **details) -> Check:
    return Check(name, "fail", summary, fix, code, details)


# ---------------------------------------------------------------------------------------- runner

class Children:
    """The probe children one `run_probes` started and that still run (each leads its own process
    group), so that an interruption kills them all, those starting at that moment included."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pids: set[int] = set()
        self.stopped = False

    def add(self, pid: int) -> None:
        with self.lock:
            self.pids.add(pid)
            if self.stopped:
                _kill_group(pid)

    def discard(self, pid: int) -> None:
        with self.lock:
            self.pids.discard(pid)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            for pid in self.pids:
                _kill_group(pid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass  # already gone


def run_probe(python: str, probe: str, arg: str = "", timeout: float = 20.0, env: dict | None = None,
              background: bool = False, children: Children | None = None) -> dict:
    """Run one probe in a child of `python` (with `env`, default ours: driver discovery puts the
    driver's link directory on its LD_LIBRARY_PATH); always returns a result, whatever the child did.
    `background`: the child gets the CPU only when others leave it (deprioritise)."""
    started = time.monotonic()
    result = {"probe": probe, "arg": arg, "ok": False, "facts": {}}
    try:
        # Own session: a timeout kills the probe and anything it started, nothing of ours.
        child = subprocess.Popen([python, "-c", CHILD_SOURCE, probe, arg], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                 env=env)
    except OSError as e:
        result["error"] = f"cannot run {python}: {e.strerror or e}"
        return result
    if background:
        deprioritise(child.pid)
    children = children or Children()
    children.add(child.pid)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        result["error"] = f"timed out after {timeout:g} s (killed)"
        result["timed_out"] = True
    finally:
        children.discard(child.pid)
    result["seconds"] = round(time.monotonic() - started, 2)
    result["returncode"] = child.returncode
    tail = err.decode(errors="replace").strip().splitlines()[-STDERR_TAIL_LINES:]
    if out.strip():
        try:
            result.update(json.loads(out))
        except ValueError:
            result["error"] = "the probe wrote an unreadable result"
    if child.returncode and "error" not in result:
        result["error"] = describe_exit(child.returncode)
    if not result["ok"] and tail:
        result["stderr_tail"] = tail
    return result


BACKGROUND_NICENESS = 10


def deprioritise(pid: int, niceness: int = BACKGROUND_NICENESS) -> None:
    """Lower a child's CPU priority, best effort. The child leads its own session, and with Linux's
    autogroup scheduling a session competes as one whole whatever its processes' niceness: so the
    session's autogroup is niced too (a process may lower its own children's priority)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
    except OSError:
        pass
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{niceness}\n")
    except OSError:  # no autogroup (kernel without it, or not Linux), or the child has gone
        pass


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"crashed: killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"crashed: killed by signal {-code}"
    return f"exited with status {code} before reporting"


# What one probe child may take at its peak (`import torch` plus CUDA's libraries: ~0.5 GiB resident).
PROBE_MEMORY_BYTES = 768 * 2**20


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def probe_slots(count: int, memory: int | None) -> int:
    """How many probes run at once: all of them, unless memory cannot hold them all.

    The probes wait on children that mostly sleep on I/O, or hang: bounding them by cores made a
    hung interpreter cost one timeout per batch (16 probes on 2 cores: 8 timeouts).
    """
    if memory is None:
        return max(1, count)
    return max(1, min(count, memory // PROBE_MEMORY_BYTES))


def run_probes(python: str, wanted: dict[str, tuple[str, str]], timeout: float = 20.0,
               env: dict | None = None, background: bool = False) -> dict[str, dict]:
    """Run probes all at once (as memory allows): {key: (probe, arg)} -> {key: result}. Interrupted
    (Ctrl-C, SIGTERM), the probes still running are killed: each leads its own session, so nothing
    else would stop them, and the pool would wait for them before the interruption is reported."""
    run = None
    try:
        run = ProbeRun(python, wanted, timeout, env, background)
        return run.results()
    finally:
        if run is not None:
            run.close()


class ProbeRun:
    """Probes started all at once (as memory allows, in the order given), read as they finish: a
    caller may wait for some of them (serve: those SGLang must not start without) while the others
    go on. Interrupted while waiting, or stopped, the probes still running are killed."""

    def __init__(self, python: str, wanted: dict[str, tuple[str, str]], timeout: float = 20.0,
                 env: dict | None = None, background: bool = False):
        self._pool = ThreadPoolExecutor(max_workers=probe_slots(len(wanted), available_memory()))
        self._children = Children()
        self._futures: dict = {}
        try:  # an interruption while they are handed out (the first ones run already) stops them too
            for key, (probe, arg) in wanted.items():
                self._futures[key] = self._pool.submit(run_probe, python, probe, arg, timeout, env, background,
                                                       self._children)
        except BaseException:
            self.stop()
            raise

    def done(self, keys=None) -> bool:
        return all(self._futures[k].done() for k in (self._futures if keys is None else keys))

    def results(self, keys=None) -> dict[str, dict]:
        """{key: result} for `keys` (default all), once each has finished."""
        futures = {k: self._futures[k] for k in (self._futures if keys is None else keys)}
        try:
            wait_awake(futures.values())
        except BaseException:
            self.stop()
            raise
        return {k: f.result() for k, f in futures.items()}

    def stop(self) -> None:
        """Kill what still runs, without waiting for it."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._children.stop()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def wait_awake(futures) -> None:
    """Wait until every future is done, waking the main thread every fraction of a second. The kernel
    may hand SIGINT/SIGTERM to any thread, and Python runs the handler (the KeyboardInterrupt, cli's
    Terminated) only once the main thread wakes: a bare `result()` could sleep through it until the
    slowest worker ends."""
    pending = set(futures)
    while pending:
        _, pending = wait(pending, timeout=WAKE_S)


WAKE_S = 0.2


# Lines of a long error that name the cause, best first: the dynamic loader's own words.
CAUSE_MARKERS = ("undefined symbol", "cannot open shared object file", "version `", "wrong ELF class")


def failure_text(r: dict) -> str:
    """The error in one line: the exception, or how the child died."""
    error = r.get("error") or "unknown failure"
    lines = [line.strip().lstrip("- ") for line in error.splitlines() if line.strip()]
    if len(lines) == 1:
        return lines[0]
    # sgl_kernel's CRITICAL message is a page long, its cause in the middle: find the loader's line.
    for marker in CAUSE_MARKERS:
        for line in lines:
            if marker in line:
                return line
    return f"{lines[0]} … {lines[-1]}"


def not_installed(r: dict) -> bool:
    return "ModuleNotFoundError" in (r.get("error") or "") and not r["facts"].get("version")


def evidence(r: dict) -> dict:
    keep = {k: r[k] for k in ("error", "where", "returncode", "stderr_tail", "timed_out") if k in r}
    return {**r.get("facts", {}), **keep}


# ---------------------------------------------------------------------------------------- checks

def check_driver(r: dict) -> Check:
    f, code = r["facts"], errors.PREFLIGHT_DRIVER
    fix = f"install NVIDIA driver >= {MIN_DRIVER} (CUDA 13)"
    if not r["ok"]:
        if "libnvidia-ml" in (r.get("error") or "") and "cannot open" in r.get("error", ""):
            return fail("driver", "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)", fix, code,
                        **evidence(r))
        return fail("driver", f"NVML failed: {failure_text(r)}", fix, code, **evidence(r))
    major = int(f["version"].split(".")[0])
    gpus = ", ".join(f"{g['name']} ({g['compute_capability']}, {g['memory_mib']} MiB)" for g in f["gpus"])
    summary = f"driver {f['version']} (CUDA {f['cuda']}), {len(f['gpus'])} GPU: {gpus or 'none'}"
    # A GPU that does not answer is the GPU's fault, not the driver's: named here, judged by gpu-health.
    silent = [f"GPU {g['index']} does not answer ({g.get('error', 'no answer')}; see gpu-health)"
              for g in f.get("unanswered") or []]
    if silent:
        summary += "; " + "; ".join(silent)
    if major < MIN_DRIVER or int(f["cuda"].split(".")[0]) < int(CUDA_LINE):
        return fail("driver", f"driver too old for CUDA 13: {summary}",
                    f"driver too old for CUDA 13: need >= {MIN_DRIVER}", code, **evidence(r))
    if not f["gpus"] and silent:  # the driver answers, its GPUs do not: gpu-health says what they need
        return warn("driver", summary, "see the gpu-health check", **evidence(r))
    if not f["gpus"]:
        return fail("driver", summary, "check that the GPUs are visible (nvidia-smi)", code, **evidence(r))
    return ok("driver", summary, **evidence(r))


def check_torch(r: dict, stack: Stack = NO_LOCK) -> Check:
    f, code = r["facts"], errors.PREFLIGHT_TORCH
    fix = f"{LOCKED}: {stack.wheel('torch')}, the CUDA {CUDA_LINE}.x build"
    if not r["ok"]:
        what = "torch is not installed" if not_installed(r) else f"torch does not import: {failure_text(r)}"
        return fail("torch", what, fix, code, **evidence(r))
    build = f"torch {f['version']} (CUDA {f['cuda'] or 'none: CPU-only build'}, C++11 ABI {f['cxx11_abi']})"
    if not f["cuda"] or f["cuda"].split(".")[0] != CUDA_LINE:
        return fail("torch", f"{build}: not a CUDA {CUDA_LINE}.x build", fix, code, **evidence(r))
    if not f["gpu_visible"]:
        return fail("torch", f"{build}: no GPU visible to torch",
                    "check the driver and CUDA_VISIBLE_DEVICES; run nvidia-smi", code, **evidence(r))
    gpus = ", ".join(f"{g['name']} ({g['compute_capability']})" for g in f["gpus"])
    return ok("torch", f"{build}, GPU: {gpus}", **evidence(r))


def check_triton(r: dict, stack: Stack = NO_LOCK) -> Check:
    if not r["ok"]:
        what = "triton is not installed" if not_installed(r) else f"triton does not import: {failure_text(r)}"
        return fail("triton", what, f"{LOCKED}: {stack.wheel('triton')} (the one torch pins)", errors.FAILED,
                    **evidence(r))
    return ok("triton", f"triton {r['facts']['version']}", **evidence(r))


def check_sgl_kernel(r: dict, stack: Stack = NO_LOCK) -> Check:
    f, code = r["facts"], errors.PREFLIGHT_KERNEL
    fix = f"{LOCKED}: {stack.wheel('sglang-kernel')}, built for {stack.wheel('torch')} + CUDA {CUDA_LINE}"
    if not r["ok"]:
        if not f.get("version"):
            return fail("sgl_kernel", "sgl_kernel (sglang-kernel) is not installed", fix, code, **evidence(r))
        where = f" on compute capability {f['compute_capability']}" if f.get("compute_capability") else ""
        missing = symbols.undefined_symbol(r.get("error") or "")
        if missing:
            return abi_mismatch(r, missing, where, stack)
        return fail("sgl_kernel", f"sglang-kernel {f.get('version')} common_ops does not load{where}: "
                    f"{failure_text(r)}", fix, code, **evidence(r))
    summary = f"sglang-kernel {f['version']}: {f['variant']}/common_ops loads (torch {f['torch']})"
    if f["variant"] != f["expected_variant"]:
        return warn("sgl_kernel", f"{summary}, but {f['expected_variant']}/ was expected for compute "
                    f"capability {f['compute_capability']}", fix, **evidence(r))
    return ok("sgl_kernel", summary, **evidence(r))


def abi_mismatch(r: dict, missing: dict, where: str, stack: Stack) -> Check:
    """common_ops needs a C++ function the installed torch lacks: the two come from different builds."""
    f = r["facts"]
    library = missing["library"] or "common_ops"
    library = "/".join(library.split("/")[-2:])  # sm90/common_ops.abi3.so: which variant failed
    torch = f"torch {f['torch']}" if f.get("torch") else "the installed torch"
    summary = (f"sglang-kernel {f.get('version')} {library} does not load{where}: undefined symbol "
               f"{symbols.describe(missing)}: this sgl_kernel was built against another torch than {torch} "
               "(torch's C++ API differs between builds)")
    fix = (f"sgl_kernel and torch must come from one build ({stack.wheel('sglang-kernel')} is built for "
           f"{stack.wheel('torch')}, CUDA {CUDA_LINE}): {stack.install}")
    return fail("sgl_kernel", summary, fix, errors.PREFLIGHT_KERNEL, **evidence(r),
                undefined_symbol=missing["symbol"], undefined_symbol_demangled=missing["demangled"])


def check_grammar(backend: str, r: dict | None, required: bool = True, stack: Stack = NO_LOCK) -> Check:
    name = f"grammar:{backend}"
    if backend == "none":
        return warn(name, "grammar backend 'none': JSON-schema, regex and tool-call constraints are refused",
                    "install the locked xgrammar and use --grammar-backend xgrammar")
    f = r["facts"]
    fix = f"{LOCKED}: {stack.wheel(backend)}"
    report = fail if required else (lambda n, s, fx, _code, **d: warn(n, s, fx, **d))
    if not r["ok"]:
        what = (f"{backend} is not installed" if not_installed(r)
                else f"{backend} {f.get('version') or ''} does not import: {failure_text(r)}".replace("  ", " "))
        if not required:
            what += f" (needed only for --grammar-backend {backend})"
        return report(name, what, fix, errors.PREFLIGHT_GRAMMAR, **evidence(r))
    if f["missing_names"]:
        missing = ", ".join(n.rsplit(".", 1)[1] for n in f["missing_names"])
        return report(name, f"{backend} {f['version']} lacks {missing} (SGLang imports them)", fix,
                      errors.PREFLIGHT_GRAMMAR, **evidence(r))
    return ok(name, f"{backend} {f['version']}: every name SGLang imports is present", **evidence(r))


def check_soundfile(r: dict, stack: Stack = NO_LOCK) -> Check:
    fix = f"{LOCKED}: {stack.wheel('soundfile')} and cffi (SGLang's OpenAI routes import soundfile at start)"
    if not r["ok"]:
        what = ("soundfile is not installed" if not_installed(r) and "soundfile" in r.get("error", "")
                else f"soundfile does not import: {failure_text(r)}")
        return fail("soundfile", what, fix, errors.PREFLIGHT_SOUNDFILE, **evidence(r))
    f = r["facts"]
    return ok("soundfile", f"soundfile {f['version']}, libsndfile {f['libsndfile']}", **evidence(r))


NATIVE_FIX = {"libnuma.so.1": "install libnuma (Debian/Ubuntu: apt install libnuma1; Nix: numactl)",
              "libcuda.so.1": f"install the NVIDIA driver >= {MIN_DRIVER}; libcuda.so.1 comes with it"}


def check_native(soname: str, r: dict) -> Check:
    name = soname.split(".so")[0]
    if not r["ok"]:
        return fail(name, f"{soname} does not load: {failure_text(r)}", NATIVE_FIX[soname],
                    errors.PREFLIGHT_NATIVE, **evidence(r))
    extra = f" (CUDA driver API {r['facts']['cuda_driver_api']})" if r["facts"].get("cuda_driver_api") else ""
    return ok(name, f"{soname} -> {r['facts']['path']}{extra}", **evidence(r))


def check_sglang(r: dict, algorithm: str | None, stack: Stack = NO_LOCK) -> Check:
    f, code = r["facts"], errors.PREFLIGHT_SGLANG
    fix = f"{LOCKED}: {stack.wheel('sglang')}"
    if not r["ok"]:
        what = ("sglang is not installed" if not_installed(r)
                else f"sglang's server_args cannot be read: {failure_text(r)}")
        return fail("sglang", what, fix, code, **evidence(r))
    known = f["speculative_algorithms"]
    if algorithm and known and algorithm.upper() not in known:  # no choices read: SGLang's start decides
        return fail("sglang", f"sglang {f['version']} does not know --speculative-algorithm {algorithm} "
                    f"(it takes {', '.join(known)})",
                    "use a patched SGLang that adds it (see the flake's sglang overrides) or another algorithm",
                    code, **evidence(r))
    algo = f", --speculative-algorithm {algorithm.upper()} known" if algorithm else ""
    return ok("sglang", f"sglang {f['version']}: server_args found{algo}", **evidence(r))


def check_flashinfer(r: dict) -> Check:
    f = r["facts"]
    fix = f"{LOCKED}: flashinfer-python and flashinfer-cubin"
    if not r["ok"]:
        if not_installed(r):
            return warn("flashinfer", "flashinfer is not installed (only --attention-backend triton works)",
                        fix, **evidence(r))
        return fail("flashinfer", f"flashinfer {f.get('version')} does not import: {failure_text(r)}", fix,
                    errors.FAILED, **evidence(r))
    if not f["cubins"]:
        return warn("flashinfer", f"flashinfer {f['version']}: no flashinfer-cubin cubins, kernels compile "
                    "at first use (a silent pause of a minute or more)", fix, **evidence(r))
    return ok("flashinfer", f"flashinfer {f['version']}, {f['cubins']} cubins from flashinfer-cubin "
              f"{f['cubin_version']}", **evidence(r))


def check_nvcc(r: dict) -> Check:
    """The stack's own CUDA compiler, which serve hands SGLang's JIT as CUDA_HOME (cuda_home.py)."""
    f = r["facts"]
    if not r["ok"]:
        return warn("nvcc", "the stack has no nvcc (nvidia-cuda-nvcc): SGLang's first start compiles JIT "
                    "kernels with the host's CUDA toolkit, if any, or fails after the weights load",
                    f"{LOCKED}: cuda-toolkit[nvcc,crt,nvvm,cccl] as nix/stack.toml pins it", **evidence(r))
    return ok("nvcc", f"nvcc {f.get('nvcc_version') or '(no wheel metadata)'} from the stack ({f['cu13']}) "
              "for SGLang's JIT kernels",
              **evidence(r))


# The packages that make most of SGLang's import time (docs/benchmarks.md, byte code).
BYTECODE_PACKAGES = ("torch", "sglang", "transformers", "triton", "sympy")
BYTECODE_SHARE = 0.9  # below it a package counts as compiled at import (tests and examples rarely have any)


def check_bytecode(r: dict, python: str = "python3") -> Check:
    """Do the stack's big packages import from byte code? Without it every SGLang process compiles
    them at each start: on the H200 its imports took about twice as long (docs/benchmarks.md)."""
    name, f = "bytecode", r["facts"]
    if not r["ok"]:
        return warn(name, f"cannot tell whether the stack has byte code: {failure_text(r)}",
                    "run doctor again; if it persists, report it with `dflashctl doctor --json`", **evidence(r))
    packages = f.get("packages") or {}
    lacking = {n: p for n, p in packages.items() if p["modules"] and p["current"] < BYTECODE_SHARE * p["modules"]}
    modules = sum(p["modules"] for p in packages.values())
    if not lacking:
        current = sum(p["current"] for p in packages.values())
        share = f"{100 * current // modules} %" if modules else "none"
        return ok(name, f"{', '.join(packages) or 'no package found'}: {share} of {modules} modules have current "
                  "byte code", **evidence(r))
    what = ", ".join(f"{n} {p['current']}/{p['modules']}" for n, p in lacking.items())
    writable = [p["path"] for p in lacking.values() if p["writable"]]
    if f.get("dont_write_bytecode") or len(writable) < len(lacking):
        why = ("PYTHONDONTWRITEBYTECODE is set" if f.get("dont_write_bytecode") else
               "their directories are read-only")
        effect = f"every start compiles them ({why}), which about doubles SGLang's import time"
    else:
        effect = "the first start compiles them, about doubling its imports (and writes byte code for the next)"
    if len(writable) == len(lacking):
        fix = f"{python} -m compileall -q -j0 " + " ".join(writable) + " (what pip and Nix do at install)"
    else:
        fix = ("install the stack with its byte code: pip without --no-compile, or the flake's dflash-env "
               "(its packages carry byte code)")
    return warn(name, f"modules without current byte code: {what}: {effect}", fix, **evidence(r))


def check_transformers(r: dict, stack: Stack = NO_LOCK) -> Check:
    f = r["facts"]
    if not r["ok"]:
        what = ("transformers is not installed" if not_installed(r)
                else f"transformers does not import: {failure_text(r)}")
        return fail("transformers", what, f"{LOCKED}: {stack.wheel('transformers')}", errors.FAILED,
                    **evidence(r))
    return ok("transformers", f"transformers {f['version']} (tokenizers {f['tokenizers']})", **evidence(r))


# ------------------------------------------------------------------------------- sets of probes

GRAMMAR_BACKENDS = sglang_0_5_11.GRAMMAR_BACKENDS


def preflight_probes(grammar_backend: str, algorithm: str | None) -> dict[str, tuple[str, str]]:
    wanted = {"driver": ("driver", ""), "libcuda": ("native", "libcuda.so.1"),
              "libnuma": ("native", "libnuma.so.1"), "torch": ("torch", ""), "sgl_kernel": ("sgl_kernel", ""),
              "soundfile": ("soundfile", ""), "sglang": ("sglang", algorithm or "")}
    if grammar_backend != "none":
        wanted[f"grammar:{grammar_backend}"] = ("grammar", grammar_backend)
    return wanted


# What SGLang must not start without: the driver and the native libraries CUDA loads, read without
# CUDA (NVML, dlopen) in a fraction of a second. The other preflight probes import the stack (torch
# and sgl_kernel take about 2 s): serve reads them beside SGLang's own imports (service/preflight.py).
BEFORE_START = ("driver", "libcuda", "libnuma")


def preflight_checks(results: dict, grammar_backend: str, algorithm: str | None,
                     stack: Stack = NO_LOCK, only: tuple[str, ...] | None = None,
                     leave_out: tuple[str, ...] = ()) -> list[Check]:
    """In root-cause order: the driver before torch, torch before what is built on it. `only` and
    `leave_out` pick checks by their probe's key ("grammar" for the grammar backend's)."""
    grammar = f"grammar:{grammar_backend}"
    checks = {"driver": lambda: check_driver(results["driver"]),
              "libcuda": lambda: check_native("libcuda.so.1", results["libcuda"]),
              "libnuma": lambda: check_native("libnuma.so.1", results["libnuma"]),
              "torch": lambda: check_torch(results["torch"], stack),
              "sgl_kernel": lambda: check_sgl_kernel(results["sgl_kernel"], stack),
              "grammar": lambda: check_grammar(grammar_backend, results.get(grammar), stack=stack),
              "soundfile": lambda: check_soundfile(results["soundfile"], stack),
              "sglang": lambda: check_sglang(results["sglang"], algorithm, stack)}
    return [build() for key, build in checks.items()
            if (only is None or key in only) and key not in leave_out]


def probe_keys(wanted: dict, checks: tuple[str, ...]) -> list[str]:
    """The probes behind checks named as preflight_checks names them."""
    return [k for k in wanted if k.split(":")[0] in checks]


PREFLIGHT_TIMEOUT_S = 60.0  # a probe of the stack's imports on a cold page cache


def preflight_wanted(grammar_backend: str, speculative_algorithm: str | None) -> dict[str, tuple[str, str]]:
    """The preflight's probes, those SGLang must not start without first in line (they get the
    first slots when memory bounds how many run at once)."""
    if grammar_backend not in sglang_0_5_11.GRAMMAR_BACKEND_CHOICES:
        raise errors.DflashError(f"unknown grammar backend {grammar_backend!r}", "",
                                 f"use one of {', '.join(GRAMMAR_BACKENDS)}, none", errors.CONFIG)
    wanted = preflight_probes(grammar_backend, speculative_algorithm)
    first = probe_keys(wanted, BEFORE_START)
    return {k: wanted[k] for k in first} | {k: v for k, v in wanted.items() if k not in first}


def preflight(grammar_backend: str, speculative_algorithm: str | None, python: str = sys.executable,
              timeout: float = PREFLIGHT_TIMEOUT_S, stack: Stack = NO_LOCK, env: dict | None = None) -> list[Check]:
    """What `serve` checks before it starts SGLang, all at once: each failure is one that would kill it later."""
    results = run_probes(python, preflight_wanted(grammar_backend, speculative_algorithm), timeout, env)
    return preflight_checks(results, grammar_backend, speculative_algorithm, stack)
