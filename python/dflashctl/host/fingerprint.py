"""A host's fingerprint: the machine, the driver, the Python environment and every probe's facts.

`doctor` builds one, prints its checks and can save it; `diff` compares two saved ones. The JSON is
the contract between them (FINGERPRINT_VERSION), so a fingerprint saved on one host today can be
compared with one saved elsewhere tomorrow.
"""

import datetime
import os
import platform
import shlex
import socket
import sys
from pathlib import Path

from packaging.version import InvalidVersion, Version

from dflashctl import __version__, inputs
from dflashctl.errors import INPUT, DflashError
from dflashctl.host import driver, faststart, gpu_health, gpus, kernels, probes, sglang_0_5_11
from dflashctl.lock import locate, lockfile
from dflashctl.systems import current_system

FINGERPRINT_VERSION = 1
# Installed by venv/pip themselves, never part of the stack: not reported as extra.
TOOLING = {"pip", "setuptools", "wheel", "dflashctl"}

DOCTOR_PROBES = {
    "python": ("python", ""), "distributions": ("distributions", ""), "driver": ("driver", ""),
    "libcuda": ("native", "libcuda.so.1"), "libnuma": ("native", "libnuma.so.1"), "torch": ("torch", ""),
    "triton": ("triton", ""), "sgl_kernel": ("sgl_kernel", ""),
    **{f"grammar:{b}": ("grammar", b) for b in probes.GRAMMAR_BACKENDS},
    "flashinfer": ("flashinfer", ""), "soundfile": ("soundfile", ""), "transformers": ("transformers", ""),
    "sglang": ("sglang", ""), "nvcc": ("cuda_toolkit", ""), "gpus": ("gpus", gpus.LIBRARY),
    "bytecode": ("bytecode", ",".join(probes.BYTECODE_PACKAGES)),
    "faststart": ("faststart", faststart.probe_arg()),
}


def host_facts() -> dict:
    libc, glibc = platform.libc_ver()
    return {"arch": platform.machine(), "system": current_system(), "kernel": platform.release(),
            "glibc": glibc if libc == "glibc" else None, "hostname": socket.gethostname()}


def same_version(installed: str, locked: str) -> bool:
    """2.11.0+cu130 is the locked 2.11.0: a local label names the build, not another release."""
    try:
        return Version(installed).public == Version(locked).public
    except InvalidVersion:
        return installed == locked


def compare_with_lock(packages: dict, found: locate.FoundLock, python_version: str) -> dict:
    """Installed distributions against the lock for this system: missing, extra, other version."""
    if found.path is None:
        return {"path": None, "source": found.source, "not_found": True,
                "error": f"no lock found (not given, ${locate.ENV} unset, none at "
                         f"{' or '.join(found.searched)})"}
    lock_path = found.path
    try:
        lock = lockfile.load(lock_path)
        locked = lock.packages(current_system())
    except DflashError as e:
        return {"path": str(lock_path), "source": found.source, "error": str(e).replace("\n  fix: ", "; ")}
    installed = {lockfile.canonical_name(n): p["version"] for n, p in packages.items()}
    return {
        "path": str(lock_path), "source": found.source, "system": current_system(), "python": lock.python,
        "spec_sha256": lock.spec_sha256,
        "python_matches": ".".join(python_version.split(".")[:2]) == lock.python,
        "missing": {n: w.version for n, w in sorted(locked.items()) if n not in installed},
        "extra": {n: v for n, v in sorted(installed.items()) if n not in locked and n not in TOOLING},
        "other_version": {n: {"locked": w.version, "installed": installed[n]}
                          for n, w in sorted(locked.items())
                          if n in installed and not same_version(installed[n], w.version)},
    }


def install_locked_hint(lock: dict, python: str, python_version: str | None = None) -> str:
    """The commands that put the locked wheels into `python`'s environment (export writes a file:
    pip reads requirements from a path, not from stdin). For a Python other than the lock's, whose
    pip would pick other wheels than the hashes allow, a new environment with the lock's Python."""
    req = "/tmp/dflash-requirements.txt"
    export = f"dflashctl export --system {lock['system']} --lock {shlex.quote(str(lock['path']))} -o {req}"
    if lock.get("python_matches") is False:
        v = lock["python"]
        return (f"this Python ({python_version or 'not ' + v}) cannot hold the stack: the lock's wheels are for "
                f"CPython {v}. Make an environment with Python {v} and install them there: `python{v} -m venv "
                f"/opt/dflash && {export} && /opt/dflash/bin/pip install --no-deps --require-hashes -r {req}`, "
                f"then run dflashctl with --python /opt/dflash/bin/python; or with Nix `{probes.NIX_INSTALL}`")
    return f"install the locked wheels: {export} && {shlex.quote(python)} -m pip install --no-deps --require-hashes -r {req}"


def locked_stack(lock: dict, python: str, python_version: str | None = None) -> probes.Stack:
    """The versions and install command the checks' fixes name, from the lock doctor compared with."""
    if "error" in lock:
        return probes.NO_LOCK
    stack = stack_of_lock(lock["path"], python)
    if stack is probes.NO_LOCK or lock.get("python_matches") is not False:
        return stack
    return probes.Stack(stack.pins, install_locked_hint(lock, python, python_version))


def stack_of_lock(path: Path | str | None, python: str) -> probes.Stack:
    """The lock's versions for this system and the commands that install them; NO_LOCK without one."""
    if path is None:
        return probes.NO_LOCK
    try:
        pins = {n: w.version for n, w in lockfile.load(path).packages(current_system()).items()}
    except DflashError:
        return probes.NO_LOCK
    hint = install_locked_hint({"system": current_system(), "path": str(path)}, python)
    return probes.Stack(pins, f"{hint}; or with Nix `{probes.NIX_INSTALL}`")


def lock_checks(lock: dict, python_version: str, python: str = "python3") -> list[probes.Check]:
    if "error" in lock:
        fix = locate.NOT_FOUND_FIX if lock.get("not_found") else "pass --lock PATH to the lock of this stack"
        return [probes.warn("lock", f"installed packages and the Python version not compared: {lock['error']}",
                            fix)]
    checks = []
    if lock["python_matches"]:
        checks.append(probes.ok("python", f"Python {python_version}, as the lock expects"))
    else:
        checks.append(probes.fail("python", f"Python {python_version}, but the lock is for Python {lock['python']}",
                                  f"run the stack with Python {lock['python']} (its wheels are built for it)",
                                  probes.errors.FAILED))
    missing, other, extra = lock["missing"], lock["other_version"], lock["extra"]
    counts = f"{len(missing)} missing, {len(other)} other version, {len(extra)} extra"
    named = [f"{n} {v['installed']} (lock {v['locked']})" for n, v in other.items()] + \
            [f"{n} missing" for n in missing]
    if missing or other:
        shown = ", ".join(named[:6]) + (f", … {len(named) - 6} more" if len(named) > 6 else "")
        checks.append(probes.fail("packages", f"{counts} against {lock['path']}: {shown}",
                                  install_locked_hint(lock, python, python_version),
                                  probes.errors.FAILED))
    elif extra:
        checks.append(probes.warn("packages", f"{counts}: {', '.join(list(extra)[:6])}",
                                  "extra packages can shadow locked ones; remove what the stack does not use"))
    else:
        checks.append(probes.ok("packages", f"every package matches {lock['path']} ({lock['source']})"))
    return checks


def doctor_checks(results: dict, lock: dict, python_version: str, python: str = "python3",
                  libraries: probes.Check | None = None) -> list[probes.Check]:
    """Every check doctor reports, in root-cause order (the same functions serve's preflight uses);
    `libraries`: driver discovery's check (driver.check)."""
    stack = locked_stack(lock, python, python_version)
    checks = lock_checks(lock, python_version, python) + ([libraries] if libraries else [])
    checks += [probes.check_driver(results["driver"]),
               probes.check_native("libcuda.so.1", results["libcuda"]),
               probes.check_native("libnuma.so.1", results["libnuma"]),
               probes.check_torch(results["torch"], stack), probes.check_triton(results["triton"], stack),
               probes.check_sgl_kernel(results["sgl_kernel"], stack)]
    # xgrammar is SGLang's default backend; the others matter only to hosts that select them.
    checks += [probes.check_grammar(b, results[f"grammar:{b}"], required=(b == sglang_0_5_11.DEFAULT_GRAMMAR_BACKEND),
                                    stack=stack)
               for b in probes.GRAMMAR_BACKENDS]
    checks += [probes.check_flashinfer(results["flashinfer"]), probes.check_soundfile(results["soundfile"], stack),
               probes.check_transformers(results["transformers"], stack),
               probes.check_sglang(results["sglang"], None, stack), probes.check_nvcc(results["nvcc"]),
               probes.check_bytecode(results["bytecode"], python), faststart.check(results["faststart"])]
    return checks


def build(python: str = sys.executable, lock_path: Path | str | None = None,
          timeout: float = 30.0, kernels_dir: str | None = None,
          model_configs: dict[str, dict] | None = None, background: bool = False,
          expected_gpus: int | None = None) -> dict:
    """Probe `python` and this host; the fingerprint as a JSON-ready dict. The probes see the
    driver the way serve's SGLang child will: through driver discovery's link directory. Without
    `lock_path`, the lock this dflashctl belongs to (lock/locate.py). The prebuilt kernels checked
    are `kernels_dir` (default $DFLASH_PREBUILT_KERNELS) for `model_configs` (default: the smoke's
    target), so doctor's and smoke's fingerprints hold the same checks. `background`: the probes
    yield the CPU to whatever else runs (smoke probes while its servers import). `expected_gpus`:
    how many GPUs the host has; NVML counting fewer fails that GPU's health check."""
    env, found = driver.locate(dict(os.environ))
    results = probes.run_probes(python, DOCTOR_PROBES, timeout, env, background)
    py = results.pop("python")
    if not py["ok"]:
        raise DflashError(f"cannot inspect {python}", probes.failure_text(py),
                          "pass --python PATH to a working Python interpreter")
    dists = results.pop("distributions")
    gpu = gpus.from_probe(results.pop("gpus"))
    packages = dists["facts"].get("packages", {})
    lock = compare_with_lock(packages, locate.find(lock_path), py["facts"]["version"])
    checks = doctor_checks(results, lock, py["facts"]["version"], py["facts"].get("executable", python),
                           driver.check(found))
    checks.append(gpus.doctor_check(gpu))
    checks += gpu_health.doctor_checks(gpu, expected_gpus)
    if kernels_dir is None:
        kernels_dir = os.environ.get(kernels.PREBUILT_ENV)
    if model_configs is None:
        model_configs = kernels.model_configs([], False)
    checks.append(kernels.doctor_check(kernels_dir, results.get("torch") or {}, model_configs))
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dflashctl": __version__,
        "host": host_facts(),
        "python": py["facts"],
        "packages": {n: packages[n]["version"] for n in sorted(packages)},
        "shadowed": [s for s in dists["facts"].get("shadowed", []) if s["name"] not in TOOLING],
        "lock": lock,
        "probes": results,
        "gpus": gpu,
        "checks": [c.to_json() for c in checks],
        "environment": {k: os.environ[k] for k in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
                        if k in os.environ},
    }


MAX_FINGERPRINT = 64 << 20  # a fingerprint is ~30 KiB, a smoke result a few hundred


def load(path: Path | str) -> dict:
    """A saved fingerprint, refused with a clear reason when it is not one. A `dflashctl smoke`
    result carries the fingerprint of the host it measured (identity.fingerprint): that one."""
    path = Path(path)
    fix = "save one with `dflashctl doctor --save FILE`"
    if not os.path.lexists(path):
        raise DflashError(f"no fingerprint at {path}", "the file does not exist", fix, INPUT)
    data = inputs.read_json(path, "fingerprint", fix, INPUT, MAX_FINGERPRINT)
    if isinstance(data, dict) and isinstance(data.get("identity"), dict):  # a smoke result
        if not data["identity"].get("fingerprint"):
            why = "; ".join(sorted(set(data["identity"].get("unknown", {}).values()))) or "none was kept"
            raise DflashError(f"the smoke result {path} carries no fingerprint", why,
                              "compare results of `dflashctl smoke` that started its servers on the host", INPUT)
        data = data["identity"]["fingerprint"]
    if not isinstance(data, dict) or data.get("fingerprint_version") != FINGERPRINT_VERSION:
        raise DflashError(f"{path} is not a dflashctl fingerprint (version {FINGERPRINT_VERSION})",
                          "the field fingerprint_version is missing or different",
                          "save it again with this dflashctl's `doctor --save FILE`", INPUT)
    problem = shape_problem(data)
    if problem:
        raise DflashError(f"{path} is not a well-formed dflashctl fingerprint", problem,
                          "save it again with `dflashctl doctor --save FILE` (do not edit it by hand)", INPUT)
    return data


# What `diff` reads, by path: the type each must have when present ("*": every key of a dict).
SHAPE = [("host", dict), ("python", dict), ("python.version", str), ("packages", dict),
         ("packages.*", (str, type(None))), ("lock", dict), ("probes", dict), ("probes.*", dict),
         ("probes.*.facts", dict), ("probes.*.error", str), ("checks", list),
         ("probes.driver.facts.version", str), ("probes.driver.facts.gpus", list),
         ("probes.torch.facts.cuda", (str, type(None))), ("probes.torch.facts.version", (str, type(None)))]
SHAPE += [(f"probes.grammar:{b}.facts.missing_names", list) for b in probes.GRAMMAR_BACKENDS]
CHECK_FIELDS = ("name", "status", "summary", "fix")
GPU_FIELDS = ("name", "compute_capability", "memory_mib")


def _at(data, path: str):
    """(where, value) for every node at `path`; absent keys yield nothing."""
    nodes = [("", data)]
    for key in path.split("."):
        nodes = [(f"{w}.{k}" if w else k, n[k]) for w, n in nodes if isinstance(n, dict)
                 for k in (n if key == "*" else [key] if key in n else [])]
    return nodes


def shape_problem(data: dict) -> str | None:
    """The first field of a fingerprint that is not what `diff` expects, or None."""
    for path, kind in SHAPE:
        for where, value in _at(data, path):
            if not isinstance(value, kind):
                return f"{where} is {type(value).__name__}, not {getattr(kind, '__name__', 'text')}"
    for i, c in enumerate(data.get("checks", [])):
        if not isinstance(c, dict) or not all(isinstance(c.get(k), str) for k in CHECK_FIELDS):
            return f"checks[{i}] must be an object with text fields {', '.join(CHECK_FIELDS)}"
    for where, names in _at(data, "probes.*.facts.missing_names"):
        if not all(isinstance(n, str) and "." in n for n in names):
            return f"{where} must list names like module.Name"
    for where, gpus in _at(data, "probes.driver.facts.gpus"):
        if not all(isinstance(g, dict) and all(k in g for k in GPU_FIELDS) for g in gpus):
            return f"{where} must list objects with {', '.join(GPU_FIELDS)}"
    return None
