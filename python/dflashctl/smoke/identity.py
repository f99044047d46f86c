"""Which host, GPU, driver and stack a smoke result measured.

The facts come from `doctor`'s fingerprint (host/fingerprint.py: the same probes, the same
package check against the lock), built in the background while the servers start. The result
keeps a condensed block for people and tables and the whole fingerprint, so `dflashctl diff
A.json B.json` explains what differs between two smoke results as between two hosts. A fact
that could not be learned is null, with the reason under `unknown`: never a guess.
"""

import os
import threading

from dflashctl.errors import DflashError
from dflashctl.host import driver, fingerprint, gpu_health, gpus, probes

FIELDS = ("hostname", "gpus", "gpu_count", "driver", "driver_cuda", "cuda_driver_api", "python", "torch",
          "triton", "sglang", "sglang_kernel", "xgrammar", "lock_spec_sha256", "lock_matches", "dflashctl")
# field -> distribution name, for the versions read from the installed packages
PACKAGES = {"triton": "triton", "sglang": "sglang", "sglang_kernel": "sglang-kernel", "xgrammar": "xgrammar"}


class Probe:
    """The fingerprint, built in a thread: probing takes a few seconds, the servers a minute. Its
    children run deprioritised: a dozen interpreters importing torch at once beside the servers'
    own imports would slow the servers' start, which is what smoke measures."""

    def __init__(self, python: str, lock_path: str, timeout: float = 120.0):
        self._fp: dict | None = None
        self._error = "not probed"
        self._thread = threading.Thread(target=self._run, args=(python, lock_path, timeout), daemon=True,
                                        name="identity")
        self._thread.start()

    def _run(self, python, lock_path, timeout):
        try:
            self._fp = fingerprint.build(python, lock_path, timeout, background=True)
        except DflashError as e:
            self._error = str(e).replace("\n  fix: ", "; ")
        except Exception as e:  # never let a probe failure cost the measurement
            self._error = f"{type(e).__name__}: {e}"

    def identity(self, wait: float = 90.0) -> dict:
        self._thread.join(wait)
        if self._thread.is_alive():
            return unknown("probing this host did not finish in time")
        return summarise(self._fp) if self._fp else unknown(f"probing this host failed: {self._error}")


def unknown(reason: str, **known) -> dict:
    """Every field null for `reason`, except those given."""
    out = {f: known.get(f) for f in FIELDS}
    out["unknown"] = {f: reason for f in FIELDS if out[f] is None}
    out["fingerprint"] = None
    return out


def _probe(fp: dict, name: str) -> tuple[dict, str | None]:
    """A probe's facts, and why it failed (None when it worked)."""
    r = fp.get("probes", {}).get(name) or {}
    if not r:
        return {}, f"the {name} probe did not run"
    return r.get("facts", {}), None if r.get("ok") else f"{name} probe: {probes.failure_text(r)}"


def summarise(fp: dict) -> dict:
    """The condensed identity of a fingerprint, the fingerprint itself under `fingerprint`."""
    out: dict = {f: None for f in FIELDS}
    why: dict = {}
    out["hostname"] = fp.get("host", {}).get("hostname")
    out["python"] = fp.get("python", {}).get("version")
    out["dflashctl"] = fp.get("dflashctl")
    driver, failed = _probe(fp, "driver")
    if failed:
        for f in ("gpus", "gpu_count", "driver", "driver_cuda"):
            why[f] = failed
    else:
        out["gpus"] = [{k: g.get(k) for k in ("name", "compute_capability", "memory_mib")}
                       for g in driver.get("gpus", [])]
        out["gpu_count"] = len(out["gpus"])
        out["driver"], out["driver_cuda"] = driver.get("version"), driver.get("cuda")
    libcuda, failed = _probe(fp, "libcuda")
    out["cuda_driver_api"] = libcuda.get("cuda_driver_api")
    if out["cuda_driver_api"] is None:
        why["cuda_driver_api"] = failed or "libcuda.so.1 did not report its version"
    packages = fp.get("packages", {})
    torch, failed = _probe(fp, "torch")
    out["torch"] = torch.get("version") if not failed else packages.get("torch")
    if out["torch"] is None:
        why["torch"] = failed or "torch is not installed"
    for field, dist in PACKAGES.items():
        out[field] = packages.get(dist)
        if out[field] is None:
            why[field] = f"no {dist} distribution (dist-info) for this Python"
    lock = fp.get("lock", {})
    if "error" in lock:
        why["lock_spec_sha256"] = why["lock_matches"] = f"not compared with a lock: {lock['error']}"
    else:
        out["lock_spec_sha256"] = lock.get("spec_sha256")
        check = next((c for c in fp.get("checks", []) if c["name"] == "packages"), None)
        out["lock_matches"] = bool(lock.get("python_matches")) and bool(check) and check["status"] != "fail"
        out["lock_check"] = check["summary"] if check else None
    for f in FIELDS:
        if out[f] is None and f not in why:
            why[f] = "not reported by the fingerprint"
    out["unknown"] = why
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    out["fingerprint"] = fp
    return out


def _or_unknown(value) -> str:
    return "?" if value is None else str(value)


def line(ident: dict) -> str:
    """One line above the table: where and with what the figures were measured."""
    gpus = ident.get("gpus")
    if gpus:
        names = sorted({f"{g['name']} (cc {g['compute_capability']}, {g['memory_mib']} MiB)" for g in gpus})
        gpu = f"{ident['gpu_count']} x {', '.join(names)}"
    else:
        gpu = "GPU ?"
    if ident.get("lock_matches") is None:
        lock = "lock ?"
    else:
        lock = (f"lock {(ident.get('lock_spec_sha256') or '?')[:12]} "
                f"{'matches' if ident['lock_matches'] else 'DIFFERS'}")
    versions = ", ".join(f"{name} {_or_unknown(ident.get(field))}" for name, field in (
        ("Python", "python"), ("torch", "torch"), ("triton", "triton"), ("sglang", "sglang"),
        ("sglang-kernel", "sglang_kernel"), ("xgrammar", "xgrammar")))
    return (f"measured on {_or_unknown(ident.get('hostname'))}: {gpu}; driver {_or_unknown(ident.get('driver'))} "
            f"(CUDA driver API {_or_unknown(ident.get('cuda_driver_api'))}); {versions}; {lock}; "
            f"dflashctl {_or_unknown(ident.get('dflashctl'))}")


# ---------------------------------------------------------------------------------- GPU health

def health(result: dict | None) -> dict:
    """Each GPU's health verdict from one NVML reading (host/gpu_health.py), or why there is none."""
    if not result or not result.get("ok"):
        return {"gpus": None, "unknown": "NVML gave no answers: " + (probes.failure_text(result) if result
                                                                      else "the host was not probed")}
    healths = gpu_health.assess(result["facts"])
    return {"gpus": [h.to_json() for h in healths], "line": gpu_health.brief(healths)}


def gpu_health_block(ident: dict | None, python: str) -> dict:
    """The GPUs' health at the start of the run (the fingerprint's NVML reading, taken as the servers
    started) and at its end (read now): a GPU that failed during the measurement is named."""
    fp = (ident or {}).get("fingerprint") or {}
    try:
        end = gpus.read(python, env=driver.provide(dict(os.environ))[0])
    except DflashError as e:
        end = {"ok": False, "error": e.what}
    return {"start": health(fp.get("gpus")), "end": health(end)}


def health_failures(block: dict | None, index: int | None = None) -> list[str]:
    """The smoke's GPU (`index`, else the first) failing its health check at the end of the run fails
    the smoke: what it measured there is suspect. Other GPUs' verdicts are only reported."""
    end = ((block or {}).get("end") or {}).get("gpus") or []
    used = next((g for g in end if g["index"] == index), None) if index is not None else (end[0] if end else None)
    if used is None or used["status"] != "fail":
        return []
    return [f"GPU health at the end of the run: {used['summary']} (fix: {used['fix']})"]


def health_line(block: dict | None) -> str | None:
    if not block:
        return None
    def part(h):
        return h.get("line") or h.get("unknown") or "?"
    return f"GPU health: at the start {part(block['start'])}; at the end {part(block['end'])}"
