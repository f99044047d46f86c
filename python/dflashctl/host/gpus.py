"""The GPUs as NVML sees them: free memory, utilization, compute processes; busy GPUs found in seconds.

`read` asks NVML in a child process (probe_child.nvml_snapshot: a driver call that hangs costs a
timeout, not the caller), through the library path it is given, so driver discovery can point it
at the libnvidia-ml it found. The answers are plain data and can be saved as a recording:

    {"format": "dflashctl-nvml-recording", "version": 1, "recorded": "<UTC time>",
     "hostname": "...", "note": "...",
     "nvml": {"library": "...", "driver": "580.159.04", "cuda": "13.0", "nested_pid_namespace": false,
              "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-...", "compute_capability": "9.0",
                        "memory_mib": {"total": 143771, "free": ..., "used": ...},
                        "utilization_percent": {"gpu": 0, "memory": 0} | null,
                        "processes": [{"pid": 4242, "name": "python3", "used_mib": 122880}] | null,
                        "health": {figure: {"rc": 0, "value": ...} | {"rc": 3, "error": "NOT_SUPPORTED"}}}],
              "unanswered": [{"index": 1, "rc": 15, "error": "GPU 1 name: GPU is lost (NVML error 15)"}],
              "count": 2}}

`health` holds each GPU's health figures with NVML's return code (host/gpu_health.py judges them);
a GPU that does not answer (lost) is under `unanswered`, so the others are still read. Recordings
made before either was read lack them.

`dflashctl doctor --record-nvml FILE` writes one; DFLASHCTL_NVML_REPLAY=FILE makes doctor and
serve read that file instead of NVML (tests; looking at another host's answers).
"""

import datetime
import json
import os
import socket
from pathlib import Path

from dflashctl import errors, output
from dflashctl.host import probes

LIBRARY = "libnvidia-ml.so.1"
REPLAY_ENV = "DFLASHCTL_NVML_REPLAY"
RECORDING_FORMAT = "dflashctl-nvml-recording"
RECORDING_VERSION = 1
RECORD_FIX = "record one with `dflashctl doctor --record-nvml FILE` on the host"


# ------------------------------------------------------------------------------ reading, recording

def read(python: str, library: str = LIBRARY, timeout: float = 20.0, env: dict | None = None) -> dict:
    """NVML's answers as a probe result ({"ok", "facts": snapshot, "error"}), or the replayed ones.
    `env`: the probe child's environment (driver discovery's LD_LIBRARY_PATH is how a Nix-built
    Python finds libnvidia-ml)."""
    env = os.environ if env is None else env
    if env.get(REPLAY_ENV):
        return {"probe": "gpus", "ok": True, "facts": load_recording(env[REPLAY_ENV])["nvml"],
                "replayed": env[REPLAY_ENV]}
    return probes.run_probe(python, "gpus", library, timeout, dict(env))


def from_probe(result: dict, env: dict | None = None) -> dict:
    """A `gpus` result doctor ran with its other probes, unless a recording is being replayed."""
    env = os.environ if env is None else env
    if env.get(REPLAY_ENV):
        return read("", env=env)
    return result


def load_recording(path: Path | str) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise errors.DflashError(f"cannot read the NVML recording {path}", str(e), RECORD_FIX) from None
    if not isinstance(data, dict) or data.get("format") != RECORDING_FORMAT or \
            data.get("version") != RECORDING_VERSION or not isinstance(data.get("nvml", {}).get("gpus"), list):
        raise errors.DflashError(f"{path} is not an NVML recording ({RECORDING_FORMAT} {RECORDING_VERSION})",
                                 "format, version or nvml.gpus is missing or different", RECORD_FIX)
    return data


def save_recording(result: dict, path: Path | str, note: str = "") -> None:
    output.write(path, recording_text(result, note), "--record-nvml")


def recording_text(result: dict, note: str = "") -> str:
    """The recording of NVML's answers (`doctor --record-nvml`), replayed by REPLAY_ENV."""
    if not result.get("ok"):
        raise errors.DflashError("NVML gave no answers to record", probes.failure_text(result),
                                 "fix the driver check first (dflashctl doctor)")
    data = {"format": RECORDING_FORMAT, "version": RECORDING_VERSION,
            "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "hostname": socket.gethostname(), "note": note, "nvml": result["facts"]}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


# ------------------------------------------------------------------------------------------ checks

def mib_text(n) -> str:
    return "?" if n is None else (f"{n / 1024:.1f} GiB" if n >= 1024 else f"{n} MiB")


def describe_processes(gpu: dict) -> str:
    procs = gpu.get("processes")
    if procs is None:
        return "compute processes not readable (" + gpu.get("processes_error", "NVML did not say") + ")"
    if not procs:
        return "no compute processes"
    return ", ".join(f"pid {p['pid']} {p.get('name') or '(name unknown)'} ({mib_text(p.get('used_mib'))})"
                     for p in procs)


def holders(gpu: dict) -> str:
    """Who holds a busy GPU's memory; memory no listed process accounts for is named too."""
    procs = gpu.get("processes") or []
    listed = sum(p.get("used_mib") or 0 for p in procs)
    unseen = gpu["memory_mib"]["used"] - listed
    if unseen <= 1024:  # the driver's own few hundred MiB
        return describe_processes(gpu)
    hidden = f"processes NVML does not list here (another container or VM?): {mib_text(unseen)}"
    return f"{describe_processes(gpu)} and {hidden}" if procs else hidden


def doctor_check(result: dict) -> probes.Check:
    """What doctor says about every GPU: free memory, utilization and who else computes on it."""
    if not result.get("ok"):
        return probes.warn("gpus", f"GPU memory, processes and health not read: {probes.failure_text(result)}",
                           "see the driver check", **probes.evidence(result))
    gpus = result["facts"]["gpus"]
    used = [g for g in gpus if g.get("processes")]
    summary = "; ".join([f"GPU {g['index']} {mib_text(g['memory_mib']['free'])} free of "
                         f"{mib_text(g['memory_mib']['total'])}" for g in gpus]
                        + [f"GPU {g['index']} does not answer (see gpu-health:{g['index']})"
                           for g in result["facts"].get("unanswered") or []]) or "no GPUs"
    if used:
        return probes.warn("gpus", summary + " — in use: " + "; ".join(
            f"GPU {g['index']}: {describe_processes(g)}" for g in used),
            "a service on a GPU that other work holds is refused (exit 87) or runs slower; free it or "
            "choose other GPUs")
    return probes.ok("gpus", summary + ", no compute processes")


def render_lines(result: dict) -> list[str]:
    """One line per GPU for doctor's table, then one per compute process."""
    if not result.get("ok"):
        return []
    lines = []
    for g in result["facts"]["gpus"]:
        mem, util = g["memory_mib"], g.get("utilization_percent")
        busy = f"{util['gpu']} % busy" if util else "utilization unknown"
        lines.append(f"gpu {g['index']}: {g['name']}, {mem['free']} MiB free of {mem['total']} MiB, {busy}, "
                     f"{len(g.get('processes') or [])} compute process(es)")
        for p in g.get("processes") or []:
            lines.append(f"       pid {p['pid']} {p.get('name') or '(name unknown)'}: {p.get('used_mib')} MiB")
    for g in result["facts"].get("unanswered") or []:
        lines.append(f"gpu {g['index']}: does not answer: {g.get('error')}")
    if result.get("replayed"):
        lines.append(f"(NVML answers replayed from {result['replayed']})")
    return lines
