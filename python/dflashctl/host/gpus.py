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
import math
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


# ----------------------------------------------------------------------------- what SGLang claims

def piecewise_graph_tokens(max_tokens: int) -> int:
    """How many piecewise CUDA graphs SGLang 0.5.11 captures (ServerArgs._generate_piecewise_cuda_graph_tokens)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return sum(1 for s in sizes if s <= max_tokens)


def sglang_default_mem_fraction(total_mib: int, tp_size: int = 1, speculative: str | None = None,
                                cuda_graph_max_bs: int | None = None, piecewise: bool = True) -> float:
    """mem_fraction_static as SGLang 0.5.11 computes it when it is not given
    (ServerArgs._handle_gpu_memory_settings), for the plain case: no DP attention, no MLA, not
    multimodal, pipeline parallel 1, default chunked prefill. It reserves MiB for activations and
    CUDA graphs and claims the rest: round((total - reserved) / total, 3).
    """
    if total_mib < 20 * 1024:
        chunk, bs = 2048, 8
    elif total_mib < 35 * 1024:
        chunk, bs = 2048, (24 if tp_size < 4 else 80)
    elif total_mib < 60 * 1024:
        chunk, bs = 4096, (32 if tp_size < 4 else 160)
    elif total_mib < 160 * 1024:
        chunk, bs = 8192, (256 if tp_size < 4 else 512)
    else:
        chunk, bs = 16384, 512
    bs = cuda_graph_max_bs or bs
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp_size / 8 * 1024
    if piecewise:
        reserved += piecewise_graph_tokens(chunk) * 8
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative and speculative.upper() not in ("NGRAM",):
        reserved += 6 * 1024 if speculative.upper() == "STANDALONE" else 4 * 1024
    return round((total_mib - reserved) / total_mib, 3)


# ------------------------------------------------------------------------------------------ checks

def _mib(n) -> str:
    return "?" if n is None else (f"{n / 1024:.1f} GiB" if n >= 1024 else f"{n} MiB")


def describe_processes(gpu: dict) -> str:
    procs = gpu.get("processes")
    if procs is None:
        return "compute processes not readable (" + gpu.get("processes_error", "NVML did not say") + ")"
    if not procs:
        return "no compute processes"
    return ", ".join(f"pid {p['pid']} {p.get('name') or '(name unknown)'} ({_mib(p.get('used_mib'))})"
                     for p in procs)


def holders(gpu: dict) -> str:
    """Who holds a busy GPU's memory; memory no listed process accounts for is named too."""
    procs = gpu.get("processes") or []
    listed = sum(p.get("used_mib") or 0 for p in procs)
    unseen = gpu["memory_mib"]["used"] - listed
    if unseen <= 1024:  # the driver's own few hundred MiB
        return describe_processes(gpu)
    hidden = f"processes NVML does not list here (another container or VM?): {_mib(unseen)}"
    return f"{describe_processes(gpu)} and {hidden}" if procs else hidden


def sglang_pool_mib(free_mib: int, total_mib: int, fraction: float) -> int:
    """What SGLang 0.5.11 gives weights + KV cache: the memory free at its start minus (1 - f) x the
    GPU's total (on the H200 a second instance with the first one's memFractionStatic on the same GPU
    got less than nothing and stopped with "Not enough memory"; 0.2 then 0.5 both ran)."""
    return int(free_mib - (1 - fraction) * total_mib)


def fitting_fraction(free_mib: int, total_mib: int) -> float | None:
    """The smallest memFractionStatic (2 decimals) whose pool is positive, or None when none is below 1."""
    f = math.floor((1 - free_mib / total_mib) * 100 + 1) / 100
    return f if f < 1 else None


def _fraction_range(free_mib: int, total_mib: int) -> tuple[float, float] | None:
    """memFractionStatic values meeting both rules of check_claim (None: none does)."""
    lo, hi = fitting_fraction(free_mib, total_mib), math.floor(free_mib / total_mib * 100) / 100
    return (lo, hi) if lo is not None and lo <= hi else None


def check_claim(result: dict, indices: list[int], fraction: float, how: str,
                shared: bool = False) -> probes.Check:
    """Refuse when SGLang would not fit on a GPU of the instance.

    Two rules. SGLang's own (always): its pool, free - (1 - f) x total, must be positive, or it stops
    with "Not enough memory" after loading the weights. Ours, unless the instance shares its GPUs
    (`shared`, allowSharedGpus): the f x total it was sized for must be free, so other work does not
    shrink it.
    """
    name = "gpu-memory"
    if not result.get("ok"):
        return probes.warn(name, f"GPU memory not checked: NVML gave no answers ({probes.failure_text(result)})",
                           "see the driver check", **probes.evidence(result))
    snapshot = result["facts"]
    by_index = {g["index"]: g for g in snapshot["gpus"]}
    absent = [i for i in indices if i not in by_index]
    if absent:
        return probes.fail(name, f"GPU {', '.join(map(str, absent))} not found: NVML sees "
                           f"{len(by_index)} GPU(s) ({', '.join(map(str, sorted(by_index))) or 'none'})",
                           "list GPUs this host has in gpus (nvidia-smi -L)", errors.CONFIG)
    busy, short, fine, loaded = [], [], [], []
    fits, ranges = [], []  # per failing GPU: the smallest fraction SGLang fits with; both rules' range
    for i in indices:
        g = by_index[i]
        mem = g["memory_mib"]
        need = int(fraction * mem["total"])
        pool = sglang_pool_mib(mem["free"], mem["total"], fraction)
        where = f"GPU {i} ({g['name']}): {_mib(mem['free'])} free of {_mib(mem['total'])}"
        if not shared and mem["free"] < need:  # ours first: the words serve printed live on the H200
            busy.append(f"{where}, SGLang claims {_mib(need)} ({how}); held by {holders(g)}")
            ranges.append(_fraction_range(mem["free"], mem["total"]))
        elif fraction and pool <= 0:
            short.append(f"{where}; SGLang's pool for weights and KV cache would be {_mib(mem['free'])} free "
                         f"- (1 - {fraction:g}) x {_mib(mem['total'])} = {pool / 1024:.1f} GiB ({how}), "
                         f"so SGLang would stop with \"Not enough memory\"; held by {holders(g)}")
            fits.append(fitting_fraction(mem["free"], mem["total"]) if shared
                        else _fraction_range(mem["free"], mem["total"]))
        else:
            fine.append(f"{where}, SGLang claims {_mib(need if not shared else min(need, pool))} ({how})")
            util = (g.get("utilization_percent") or {}).get("gpu") or 0
            if util > 0 or g.get("processes"):
                loaded.append(f"GPU {i} is {util} % busy: {describe_processes(g)}")
    if short:
        if not all(fits):
            fix = ("no memFractionStatic fits on this GPU now (SGLang's pool needs a larger one, and "
                   + ("any larger one is refused unless f x total is free; set allowSharedGpus to share"
                      if not shared else "none is below 1") + "): stop the processes holding it")
        elif shared:
            fix = (f"set memFractionStatic to at least {max(fits):.2f} plus the weights' share of the GPU "
                   "(the pool holds the weights and the KV cache), or free the GPU")
        else:
            lo, hi = max(r[0] for r in fits), min(r[1] for r in fits)
            fix = (f"set memFractionStatic from {lo:.2f} (plus the weights' share of the GPU) to {hi:.2f}"
                   if lo <= hi else "free the GPU: no memFractionStatic fits on all of its GPUs")
        return probes.fail(name, "; ".join(short), fix + "; `dflashctl doctor` lists every GPU's processes",
                           errors.PREFLIGHT_GPU_BUSY)
    if busy:
        if all(ranges):
            lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
            lower = (f"set memFractionStatic from {lo:.2f} to {hi:.2f} (both rules fit: SGLang's pool, free - "
                     "(1 - f) x total, stays positive and f x total is free)" if lo <= hi else None)
        else:
            lower = None
        return probes.fail(name, "; ".join(busy),
                           "stop the processes holding it, give the instance free GPUs (gpus), or "
                           + (lower or "free it: no memFractionStatic fits next to that work (a lower one "
                              "leaves SGLang's pool, free - (1 - f) x total, at or below zero)")
                           + "; `dflashctl doctor` lists every GPU's processes", errors.PREFLIGHT_GPU_BUSY)
    if loaded:
        return probes.warn(name, "; ".join(fine + loaded),
                           "other work shares these GPUs: expect lower throughput; move one of them")
    return probes.ok(name, "; ".join(fine))


def doctor_check(result: dict) -> probes.Check:
    """What doctor says about every GPU: free memory, utilization and who else computes on it."""
    if not result.get("ok"):
        return probes.warn("gpus", f"GPU memory, processes and health not read: {probes.failure_text(result)}",
                           "see the driver check", **probes.evidence(result))
    gpus = result["facts"]["gpus"]
    used = [g for g in gpus if g.get("processes")]
    summary = "; ".join([f"GPU {g['index']} {_mib(g['memory_mib']['free'])} free of "
                         f"{_mib(g['memory_mib']['total'])}" for g in gpus]
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
