"""A server that hangs while starting, named long before startTimeoutSec.

Start-up progress is new log output or a change in the GPU memory used on the instance's GPUs
(weights and CUDA graphs land there without a log line). Neither for `stallTimeoutSec` seconds
means SGLang is stuck (a lock, a collective that never completes, a download that stalled): the
supervisor stops it and reports the last thing it logged (errors.SERVER_STALLED, restartable).
Our own health polls, and our readiness token after the warm-up line (server.py), appear in
SGLang's access log once its HTTP server is up; they are not progress. GPU memory is read through
NVML in a child process (host/gpus.py) every few seconds; without NVML, log output alone counts.
"""

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

# our polls in SGLang's access log: /health_generate, and the readiness token (server.py) once the
# warm-up line is out; a token refused again and again is not a start moving on
NOT_PROGRESS = ("/health", "POST /generate ")
GPU_SAMPLE_S = 5.0


class GpuMemory:
    """Used memory of some GPUs, sampled in a background thread: `latest` is a tuple of MiB, or
    None when NVML gave no answer (then the watch relies on the log alone)."""

    def __init__(self, read: Callable[[], dict], indices: list[int], interval: float = GPU_SAMPLE_S):
        self._read, self.indices, self.interval = read, list(indices), interval
        self.latest: tuple[int, ...] | None = None
        self.available = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "GpuMemory":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            result = self._read()
            if not result.get("ok"):
                self.available = False  # no NVML here: log-only
                return
            used = {g["index"]: g["memory_mib"]["used"] for g in result["facts"]["gpus"]}
            self.latest = tuple(used.get(i, -1) for i in self.indices)
            self._stop.wait(self.interval)


class StallWatch:
    """Call `stalled()` while waiting; it reads what the log gained and the GPU memory's latest sample.
    `found` holds those of `look_for` the log held, from `offset` on (the one reader of the log while
    serve waits, so serve's readiness can wait for SGLang's warm-up line, and see a failed bind)."""

    def __init__(self, timeout: float, log_path: Path, offset: int = 0, gpu: GpuMemory | None = None,
                 clock: Callable[[], float] = time.monotonic, look_for: tuple[str, ...] = ()):
        self.timeout, self.log_path, self.offset, self.gpu, self.clock = timeout, Path(log_path), offset, gpu, clock
        self.last_progress = clock()
        self.last_line = ""
        self.look_for, self.found = look_for, set()
        self._partial = b""
        self._gpu_seen = gpu.latest if gpu else None

    def _log_progressed(self) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 20)
        except OSError:
            return False
        if not data:
            return False
        self.offset += len(data)
        # the unfinished line before this read, so a line split between two reads is still found
        seen = self._partial + data
        self.found |= {text for text in self.look_for if text.encode() in seen}

        def counts(raw: bytes) -> bool:
            text = raw.decode("utf-8", "replace").strip()
            return bool(text) and not any(marker in text for marker in NOT_PROGRESS)

        # \r as well as \n: a progress bar (tqdm: "Loading safetensors checkpoint shards: 40%")
        # redraws one line, and each redraw is progress. Judged on the new bytes alone, so a line
        # finished later is not counted twice.
        moved = any(counts(seg) for seg in re.split(rb"[\r\n]", data))
        *lines, partial = re.split(rb"[\r\n]", self._partial + data)
        self._partial = partial[-4096:]  # a writer that never ends a line cannot grow this
        for raw in (*lines, self._partial):
            if counts(raw):
                self.last_line = raw.decode("utf-8", "replace").strip()
        return moved

    def _gpu_progressed(self) -> bool:
        if self.gpu is None or self.gpu.latest is None or self.gpu.latest == self._gpu_seen:
            return False
        first = self._gpu_seen is None
        self._gpu_seen = self.gpu.latest
        return not first  # the first sample is where we start from, not a change

    def read(self) -> None:
        """Take in what the log gained and the GPU memory's latest sample."""
        log, gpu = self._log_progressed(), self._gpu_progressed()
        if log or gpu:
            self.last_progress = self.clock()

    def stalled(self) -> bool:
        self.read()
        return self.timeout > 0 and self.clock() - self.last_progress >= self.timeout

    def watching(self) -> str:
        if self.gpu is not None and self.gpu.available:
            return "no new log output and no change in GPU memory"
        return "no new log output (GPU memory not readable: log only)"
