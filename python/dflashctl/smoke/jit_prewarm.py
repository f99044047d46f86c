"""Compile SGLang's JIT kernels in parallel while the servers import, instead of one after another
inside their first CUDA-graph capture.

On a fresh host SGLang 0.5.11 compiles its tvm-ffi kernels (sglang.jit_kernel: QK-norm, RoPE,
KV-cache store, activation, ...) with nvcc at their first call, which comes during the first
CUDA-graph capture: one module after another, about 50 s on the H200 (docs/benchmarks.md), after
about 20 s of imports. This child of the stack's Python (host/jit_child.py) calls SGLang's own
module loaders with the shapes the servers will use, all at once on separate threads (nvcc runs as
a subprocess), in the servers' environment, so it builds the same modules into the same cache directories. tvm-ffi
locks each module's build directory: a server that reaches a kernel still being built waits for
it instead of compiling it again, and finds the rest built. Nothing here is required: a failed
or mistaken call only costs CPU time, and the server compiles what it needs as before.
"""

import json
import os
import signal
import subprocess
import threading
import time

from dflashctl import stop_signals
from dflashctl.host import jit_child, kernels
from dflashctl.host.kernels import calls_for  # noqa: F401 (the loaders the prewarm calls)


class Prewarm:
    """The compiling child, started (`start()`) beside the servers; `result()` collects what it did."""

    def __init__(self, python: str, env: dict, calls: list[list]):
        self.python, self.env, self.calls = python, env, calls
        self.started = time.monotonic()
        self.proc: subprocess.Popen | None = None
        self._output: tuple[bytes, bytes] = (b"", b"")
        self._ended: float | None = None
        self._waiter = threading.Thread(target=self._wait, daemon=True, name="jit-prewarm")

    def start(self) -> "Prewarm":
        """Separate from construction: the caller holds the object before a stop can come (stop())."""
        self.started = time.monotonic()
        with stop_signals.deferred():
            self.proc = subprocess.Popen([self.python, "-c", kernels.JIT_CHILD, "prewarm", json.dumps(self.calls)],
                                         env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        self._waiter.start()
        return self

    def _wait(self) -> None:
        self._output = self.proc.communicate()
        self._ended = time.monotonic()

    def result(self, timeout: float = 5.0) -> dict:
        """What it compiled; the servers are ready by now, so a child still running is killed."""
        self._waiter.join(timeout)
        if self._ended is None:
            self.stop()
            return {"enabled": True, "ok": False, "error": "still compiling when the servers were ready; stopped"}
        out, err = self._output
        seconds = round(self._ended - self.started, 2)
        try:
            done = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            return {"enabled": True, "ok": False, "error": f"exited with status {self.proc.returncode}: "
                                                           + " | ".join(tail)}
        calls = [named(c) for c in done["calls"]]
        return {"enabled": True, "ok": all(c["ok"] for c in calls), "wall_s": seconds, **done, "calls": calls}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def named(result: dict) -> dict:
    """A child's result (host/jit_child.py) as the smoke reports it: the call by name, short errors."""
    module, function, args = result["call"]
    out = {**result, "call": f"{module.rsplit('.', 1)[-1]}.{function}({', '.join(map(str, args))})"}
    if "error" in out:
        out["error"] = "SGLang could not build it" if out["error"] == jit_child.NOT_BUILT else out["error"][:300]
    return out


def line(pre: dict | None) -> str | None:
    """One line under the table."""
    if not pre:
        return None
    if pre.get("covered"):
        return f"JIT prewarm: not needed, {pre.get('reason')}"
    if not pre.get("enabled"):
        return (f"JIT prewarm: off ({pre.get('reason')}): each server compiled SGLang's kernels one by one "
                "at first use")
    if "calls" not in pre:
        return f"JIT prewarm: failed ({pre.get('error')}); the servers compiled what they needed themselves"
    ok = [c for c in pre["calls"] if c["ok"]]
    errors: dict[str, list[str]] = {}
    for c in pre["calls"]:
        if not c["ok"]:
            errors.setdefault(c["error"], []).append(c["call"])
    text = (f"JIT prewarm: {len(ok)}/{len(pre['calls'])} kernel modules ready {pre['wall_s']:.1f}s after the "
            f"servers started (imports {pre['imports_s']:.1f}s, slowest build "
            f"{max((c.get('seconds', 0) for c in ok), default=0):.1f}s)")
    for error, calls in errors.items():
        text += f"; not built: {', '.join(calls) if len(calls) < 3 else f'{len(calls)} modules'}: {error}"
    return text
