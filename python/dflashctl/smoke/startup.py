"""Where a server's start-up time goes, from SGLang's own log and from the JIT caches.

SGLang 0.5.11 logs `[YYYY-mm-dd HH:MM:SS(.mmm)( TP0…)] message`; smoke starts its servers with
SGLANG_LOG_MS=1, so the stamps carry milliseconds. The lines that mark the phases (their text is
in srt/entrypoints/engine.py, srt/model_executor/model_runner.py, srt/entrypoints/http_server.py;
the patterns are smoke/sglang_0_5_11.py's):

    server_args=ServerArgs(…)                   the main process has imported SGLang
    Init torch distributed begin.               the scheduler process has imported and starts the model
    Load weight begin. / Load weight end.       once per model (DFLASH: target, then drafter)
    Capture cuda graph begin. / … end.          once per model runner; SGLang's JIT kernels compile
                                                here, at their first call (tvm-ffi, flashinfer, Triton)
    The server is fired up and ready to roll!   HTTP up and SGLang's own warm-up request done

With the fast start (host/kernel_hook/dflash_faststart.py) the stack's hook adds its own lines,
stamped the same way: when the template is ready (its imports, which run beside the server's) and
how each child started (forked from the template, or spawned and why); `faststart` reads them, so
"scheduler start" can be told apart: a fork plus SGLang's own modules, or a whole new import.

SGLang logs nothing when it compiles a kernel, so compiling is read from the caches it compiles
into: a tvm-ffi or flashinfer module is a directory with build.ninja (written when its build
starts) and the .so (when it ends); a Triton kernel is a directory of files written when it ends.
Caches are shared by servers that start side by side, so compiling is reported for the host.
"""

import datetime as dt
import os
import re
from pathlib import Path

from dflashctl.host import jit_caches as host_jit_caches
from dflashctl.host.kernel_hook import dflash_faststart
from dflashctl.smoke import jit_prewarm, sglang_0_5_11

STAMP = sglang_0_5_11.LOG_STAMP
MARKERS = sglang_0_5_11.START_UP_MARKERS  # (event, text the message starts with)
# (key, what it is) in start-up order; docs/smoke.md explains each.
PHASES = (
    ("imports", "Python imports (launch -> server_args logged)"),
    ("scheduler_start", "scheduler process start and its imports"),
    ("model_init", "torch.distributed and model set-up, until the weights load"),
    ("weight_load", "weight load"),
    ("memory_pool", "KV cache and attention back-end, between load and capture"),
    ("cuda_graph_capture", "CUDA-graph capture, JIT compiling at first kernel use included"),
    ("server_warmup", "HTTP server and SGLang's warm-up request"),
    ("first_healthy_decode", "until the first real decode (service/server.py's readiness; smoke's clock)"),
)


def _stamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace(" ", "T"))


def events(log_text: str, since: dt.datetime | None = None) -> list[tuple[dt.datetime, str, str]]:
    """(time, event, message) of every marker line; lines stamped before `since` (an earlier run
    appended to the same log) are skipped."""
    found = []
    for line in log_text.splitlines():
        m = STAMP.match(line.strip())
        if not m:
            continue
        when, message = _stamp(m.group(1)), m.group(2)
        if since is not None and when < since.replace(microsecond=0):
            continue
        for event, head in MARKERS:
            if message.startswith(head):
                found.append((when, event, message))
                break
    # Several processes write the log (main, scheduler): order by stamp, file order among equals.
    return sorted(found, key=lambda f: f[0])


# The phase a server is in once a marker is seen; between a load or capture's end and the next
# begin it sets up memory and the drafter ("memory_pool"); the last such stretch before SGLang's
# warm-up is "server_warmup".
NEXT_PHASE = {"args": "scheduler_start", "dist_begin": "model_init", "load_begin": "weight_load",
              "load_end": "memory_pool", "capture_begin": "cuda_graph_capture", "capture_end": "memory_pool",
              "fired_up": "first_healthy_decode"}


def phases(log_text: str, launched: dt.datetime, ready_s: float | None = None) -> dict:
    """Seconds per phase of one server, from its SGLang log; the phases split launch (`launched`,
    local time as SGLang stamps) .. ready (`ready_s`, its first real decode), so
    they add up to `ready_s`. A phase whose lines are missing is None; `missing_lines` names them."""
    evs = events(log_text, launched)
    seconds: dict = {key: None for key, _ in PHASES}
    state, since = "imports", 0.0
    end = ready_s if ready_s is not None else (
        (evs[-1][0] - launched).total_seconds() if evs else 0.0)

    def close(until: float) -> None:
        until = min(max(until, since), end)
        seconds[state] = round((seconds[state] or 0.0) + until - since, 3)

    for when, event, _ in evs:
        t = (when - launched).total_seconds()
        if event == "fired_up" and state == "memory_pool":
            state = "server_warmup"  # after the last capture: HTTP server and SGLang's own warm-up
        close(t)
        state, since = NEXT_PHASE[event], max(since, min(t, end))
    close(end)
    seen = {e for _, e, _ in evs}
    missing = [m for m in ("args", "dist_begin", "load_begin", "capture_begin", "fired_up") if m not in seen]
    return {"seconds": seconds, "ready_s": None if ready_s is None else round(ready_s, 3),
            "faststart": faststart(log_text, launched),
            "weight_loads": sum(e == "load_begin" for _, e, _ in evs),
            "graph_captures": sum(e == "capture_begin" for _, e, _ in evs),
            "missing_lines": [next(text for e, text in MARKERS if e == m) for m in missing]}


FASTSTART_READY = re.compile(r"template ready: (\d+) modules imported in ([\d.]+) s")
FASTSTART_CHILD = re.compile(r"^(\S+): (?:forked from the template|spawned: (.*))")
FASTSTART_LEFT_OUT = re.compile(r"^template: (\S+) left out: (.*); starting over without it$")


def faststart(log_text: str, since: dt.datetime | None = None) -> dict | None:
    """What the fast start's lines say (None: no line, it was off): the template's import seconds
    (None when it was not usable, with why), the entries of its list it left out and why (their
    import reached CUDA or failed), the children forked and those spawned with why."""
    found: dict = {"template_s": None, "modules": None, "unusable": None, "left_out": {}, "forked": [],
                   "spawned": {}}
    seen = False
    for line in log_text.splitlines():
        m = STAMP.match(line.strip())
        if not m or not m.group(2).startswith(dflash_faststart.TAG):
            continue
        if since is not None and _stamp(m.group(1)) < since.replace(microsecond=0):
            continue
        seen, text = True, m.group(2)[len(dflash_faststart.TAG):].strip()
        ready, child = FASTSTART_READY.search(text), FASTSTART_CHILD.search(text)
        left_out = FASTSTART_LEFT_OUT.search(text)
        if left_out:
            found["left_out"][left_out.group(1)] = left_out.group(2)
        elif ready:
            found["modules"], found["template_s"] = int(ready.group(1)), float(ready.group(2))
        elif text.startswith(("template not usable: ", "off: ")):
            found["unusable"] = text.split(": ", 1)[1]
        elif child and child.group(2) is not None:
            found["spawned"][child.group(1)] = child.group(2)
        elif child:
            found["forked"].append(child.group(1))
    return found if seen else None


def faststart_text(f: dict | None) -> str:
    """The start-up line's note on how the children started."""
    if f is None:
        return ""
    parts = []
    if f["forked"]:
        parts.append(f"{', '.join(f['forked'])} forked from the template (its imports {f['template_s']:.1f}s, "
                     "beside the server's)")
    for name, why in f["spawned"].items():
        parts.append(f"{name} spawned: {why}")
    if not parts and f["unusable"]:
        parts.append(f"fast start not used: {f['unusable']}")
    return "; ".join(parts)


# --- JIT caches -------------------------------------------------------------------------------------

def jit_caches(env=os.environ, triton_cache: str | None = None) -> dict[str, Path]:
    """Where SGLang's servers compile to (host/jit_caches.py: their variables, else the tools' rules)."""
    found = host_jit_caches.caches(dict(env))
    caches = {name: found[name] for name in ("tvm-ffi", "flashinfer", "triton")}
    if triton_cache:
        caches["triton"] = Path(triton_cache)
    return caches


def _mtimes(d: Path) -> list[tuple[str, float]]:
    try:
        return [(f.name, f.stat().st_mtime) for f in d.iterdir() if f.is_file()]
    except OSError:
        return []


def compiled_since(caches: dict[str, Path], since: float) -> dict:
    """What each cache gained since `since` (epoch seconds): modules with when their build began
    and ended, in seconds after `since`. A module built before is not listed (a cache hit)."""
    out = {}
    for name, root in caches.items():
        items = []
        if name == "triton":
            dirs = [d for d in _safe_dirs(root)]
        else:  # ninja-built modules, at any depth (flashinfer nests them by version and arch)
            dirs = [p.parent for p in _safe_glob(root, "build.ninja")]
        for d in dirs:
            files = _mtimes(d)
            if not files:
                continue
            began, ended = min(t for _, t in files), max(t for _, t in files)
            if name != "triton":  # build.ninja when the build began, the .so when it ended
                ninja = [t for f, t in files if f == "build.ninja"]
                built = [t for f, t in files if f.endswith(".so")]
                if not built:
                    continue  # failed or still building
                began, ended = (ninja[0] if ninja else began), max(built)
            if ended < since:
                continue  # built by an earlier start: a cache hit
            items.append({"module": d.name, "began_s": round(began - since, 2), "ended_s": round(ended - since, 2)})
        items.sort(key=lambda i: i["began_s"])
        out[name] = {"dir": str(root), "compiled": len(items), "modules": items,
                     "busy_s": _union(items) if name != "triton" else None,
                     "first_s": items[0]["began_s"] if items else None,
                     "last_s": max(i["ended_s"] for i in items) if items else None}
    return out


def _safe_dirs(root: Path) -> list[Path]:
    try:
        return [d for d in root.iterdir() if d.is_dir()]
    except OSError:
        return []


def _safe_glob(root: Path, name: str) -> list[Path]:
    try:
        return list(root.rglob(name))
    except OSError:
        return []


def _union(items: list[dict]) -> float:
    """Seconds during which at least one module was compiling."""
    busy, end = 0.0, None
    for i in sorted(items, key=lambda i: i["began_s"]):
        a, b = max(0.0, i["began_s"]), i["ended_s"]
        if end is None or a > end:
            busy += max(0.0, b - a)
            end = b
        elif b > end:
            busy += b - end
            end = b
    return round(busy, 2)


# --- report -----------------------------------------------------------------------------------------

def lines(result: dict) -> list[str]:
    """Under the table: one line per server, one for the JIT prewarm, one for the JIT caches, and
    one where the stack lacks byte code."""
    out = []
    for run in result.get("runs", []):
        start = run.get("startup")
        if not start:
            continue
        parts = [f"{key.replace('_', ' ')} {v:.1f}s" for key, v in start["seconds"].items() if v is not None]
        missing = f" (lines not in its log: {'; '.join(start['missing_lines'])})" if start["missing_lines"] else ""
        note = faststart_text(start.get("faststart"))
        out.append(f"start-up {run['name']}: " + ", ".join(parts) + missing + (f" ({note})" if note else ""))
    pre = jit_prewarm.line(result.get("jit_prewarm"))
    if pre:
        out.append(pre)
    jit = result.get("jit_compiled")
    if jit:
        parts = []
        for name, c in jit.items():
            if not c["compiled"]:
                parts.append(f"{name} nothing new")
            elif c["busy_s"] is not None:
                parts.append(f"{name} {c['compiled']} modules, compiling {c['busy_s']:.1f}s between "
                             f"{c['first_s']:.1f}s and {c['last_s']:.1f}s")
            else:
                parts.append(f"{name} {c['compiled']} kernels, written between {c['first_s']:.1f}s and "
                             f"{c['last_s']:.1f}s")
        out.append("JIT compiled during this smoke (seconds after the servers started): " + "; ".join(parts))
    # Imports are most of a start once nothing compiles, and only fast from byte code (doctor's check).
    checks = ((result.get("identity") or {}).get("fingerprint") or {}).get("checks", [])
    bytecode = next((c for c in checks if c["name"] == "bytecode"), None)
    if bytecode and bytecode["status"] != "ok":
        out.append(f"Python byte code: {bytecode['summary']}; fix: {bytecode['fix']}")
    return out
