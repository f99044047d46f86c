"""The GPU watch beside a serving instance: a GPU that fails is seen within a second, and named.

One child process of the stack's Python (probe_child.probe_gpu_watch, NVML through the same ctypes
reader as doctor and preflight, found through the same driver link directory) blocks in
nvmlEventSetWait_v2 on a critical-XID event set for the instance's GPUs, and wakes at least once a
second to read each GPU's watch figures (uncorrected ECC count, row remap state, recovery action;
about 0.05 ms per GPU on the H200). It writes what it sees as JSON lines; a thread here reads
them and judges them with host/gpu_health.py. Nothing runs on the decode path: the child sleeps in
the driver between events, serve's thread sleeps in read(), and neither touches CUDA.

A child, not a thread of serve: a driver call that hangs on a sick GPU then hangs the watch, not
the supervisor, and the NVML it loads is the one SGLang's environment resolves (a Nix-built Python
finds libnvidia-ml only through driver discovery's LD_LIBRARY_PATH). Where NVML cannot be read
the watch is off and says why; the instance serves on, as it did before the watch existed.
"""

import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from dflashctl import stop_signals
from dflashctl.host import gpu_health, probes

POLL_S = 1.0  # at most once a second: a lost GPU is named within it, at 0.005 % of a core per GPU (0.05 ms a read)
# In the instance's environment (its `environment` setting) "0" turns the watch off: a driver whose
# NVML events misbehave, or benchmarks/gpu/watch_cost.py measuring what the watch costs.
OFF_ENV = "DFLASHCTL_GPU_WATCH"


@dataclass
class GpuFailure:
    label: str  # "GPU 0 (NVIDIA H200, GPU-…, PCI …)"
    index: int | None
    finding: gpu_health.Finding

    def what(self) -> str:
        return f"{self.label}: {self.finding.what}"


class GpuWatch:
    def __init__(self, python: str, indices: list[int], env: dict[str, str], poll_s: float = POLL_S,
                 on_note: Callable[[str], None] | None = None, on_state: Callable[[str], None] | None = None):
        """`on_note(text)`: a warning seen while watching; `on_state(describe())`: once it watches or
        is off. Both are called from the watch's reader thread."""
        self.python, self.indices, self.env, self.poll_s = python, list(indices), dict(env), poll_s
        self.on_note = on_note or (lambda text: None)
        self.on_state = on_state or (lambda text: None)
        self.failure: GpuFailure | None = None
        self.state = "starting"  # starting | watching | off: <why> | stopped
        self.notes: list[str] = []
        self._labels: dict[int, str] = {i: f"GPU {i}" for i in self.indices}
        self._baseline: dict[int, dict] = {}
        self._failed = threading.Event()
        self._started = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    # --- the child ------------------------------------------------------------------------------
    def start(self) -> "GpuWatch":
        if self.env.get(OFF_ENV) == "0":
            self._off(f"turned off ({OFF_ENV}=0)")
            return self
        arg = ",".join(map(str, self.indices)) + f";{self.poll_s:g}"
        try:
            # stderr nowhere: a pipe nobody drains would stop the child once full; its failures come
            # as its result on stdout, a crash as its exit status.
            with stop_signals.deferred():  # a stop arriving now is handled once self._proc is set
                self._proc = subprocess.Popen([self.python, "-c", probes.CHILD_SOURCE, "gpu_watch", arg],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, env=self.env, start_new_session=True)
        except OSError as e:
            self._off(f"cannot run {self.python}: {e.strerror or e}")
            return self
        self._thread = threading.Thread(target=self._read, daemon=True, name="gpu-watch")
        self._thread.start()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def wait_started(self, timeout: float = 10.0) -> str:
        """Until the child watches (or gave up); the state, for the log."""
        self._started.wait(timeout)
        return self.state

    def stop(self) -> None:
        if self.state in ("starting", "watching"):
            self.state = "stopped"
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def wait_failure(self, timeout: float) -> GpuFailure | None:
        """The failure, waiting up to `timeout` for one (SGLang died: was its GPU the cause?)."""
        if self.state == "watching":
            self._failed.wait(timeout)
        return self.failure

    def describe(self) -> str:
        if self.state == "watching":
            gpus = ", ".join(self._labels[i] for i in self.indices)
            return (f"GPU watch: watching {gpus} for critical XID events (a blocking wait) and lost GPUs, new "
                    f"uncorrected ECC errors, failed row remaps and recovery actions (read every {self.poll_s:g} s)")
        return f"GPU watch: {self.state}"

    # --- what it says -----------------------------------------------------------------------------
    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self._on(event)
        if self.state in ("starting", "watching"):  # the child ended without being stopped
            self._off("the watch process ended: " + probes.describe_exit(self._proc.wait()))

    def _on(self, event: dict) -> None:
        kind = event.get("event")
        if kind is None and event.get("ok") is False:  # the probe failed (no NVML here)
            self._off(probes.failure_text(event))
        elif kind == "start":
            self._on_start(event)
        elif kind == "xid":
            i = event.get("index")
            self._judge(i, gpu_health.xid_finding(int(event.get("xid") or 0), i if i is not None else 0))
        elif kind == "figures":
            i = event["index"]
            self._judge(i, gpu_health.watch_finding(self._baseline.get(i, {}), event["figures"], i))
        elif kind == "wait" and event.get("rc") in (gpu_health.GPU_IS_LOST, gpu_health.RESET_REQUIRED) \
                and len(self.indices) == 1:
            i = self.indices[0]
            self._judge(i, gpu_health.unanswered({"rc": event["rc"], "error": event.get("error")}, i))

    def _on_start(self, event: dict) -> None:
        for g in event.get("gpus", []):
            i = g["index"]
            if g["handle"]["rc"] != 0:
                self._judge(i, gpu_health.unanswered({"rc": g["handle"]["rc"], "error": g["handle"].get("error")}, i))
                continue
            health = gpu_health.assess_gpu({"index": i, "name": g.get("name"), "uuid": g.get("uuid"),
                                            "health": g.get("health") or {}})
            self._labels[i] = health.label
            self._baseline[i] = g.get("figures") or {}
            if g.get("xid_events", {}).get("rc"):
                self._note(f"{health.label}: no critical-XID events ({g['xid_events'].get('error')}): "
                           f"watched by reading it every {self.poll_s:g} s only")
        self.state = "watching"
        self._started.set()
        self.on_state(self.describe())

    def _judge(self, i: int | None, finding: gpu_health.Finding | None) -> None:
        if finding is None:
            return
        label = self._labels.get(i, f"GPU {i}") if i is not None else \
            ", ".join(self._labels[x] for x in self.indices)
        if finding.status == "fail" and self.failure is None:
            self.failure = GpuFailure(label, i, finding)
            self._failed.set()
        elif finding.status != "fail":
            self._note(f"{label}: {finding.what}")

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            self.on_note(text)

    def _off(self, why: str) -> None:
        self.state = f"off: {why}"
        self._started.set()
        self.on_state(self.describe())
