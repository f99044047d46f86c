"""Scenarios for the stand-in libnvidia-ml (tests/data/gpus/fake_nvml.c): how each GPU answers NVML.

The healthy scenario is the H200's recording (tests/data/gpus/h200-health.json, every figure with
the return code NVML gave there), flattened to the stand-in's `KEY RC VALUE` lines; the sick ones
change the figures a failing GPU changes. A host of several GPUs repeats the recorded GPU with its
own index, UUID and PCI bus id (the recording has one GPU). Figures the recording does not have
(the GPU recovery action) are absent: the stand-in answers NOT_SUPPORTED for them.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "gpus"
RECORDING = DATA / "h200-health.json"
# nvmlClocksEventReason* (nvml.h): thermal slowdown, in software and in hardware
SW_THERMAL, HW_THERMAL = 0x20, 0x40


def recorded_gpu() -> dict:
    return json.loads(RECORDING.read_text())["gpus"][0]


def flatten(prefix: str, node) -> list[str]:
    """{"rc": 0, "value": ...} leaves become `prefix rc value` lines; a dict value, one line per field."""
    if isinstance(node, dict) and "rc" in node:
        value = node.get("value")
        if isinstance(value, dict):
            return [f"{prefix}.{k} {node['rc']} {v}" for k, v in value.items()]
        return [f"{prefix} {node['rc']}" + ("" if value is None else f" {value}")]
    if isinstance(node, dict):
        return [line for k, v in node.items() for line in flatten(f"{prefix}.{k}", v)]
    return []


# Recorded figures the stand-in answers elsewhere or not at all (timings, the recorder's own calls).
NOT_ANSWERED = ("health_read_ms", "event_wait_100ms", "event_set_create", "index", "serial",
                "clock_throttle_reasons", "persistence_mode")


def gpu_lines(index: int, gpu: dict | None = None) -> list[str]:
    gpu = dict(gpu or recorded_gpu())
    if index:
        gpu["uuid"] = {"rc": 0, "value": gpu["uuid"]["value"][:-2] + f"{index:02d}"}
        pci = dict(gpu["pci"]["value"], busId=f"00000000:00:{6 + index:02x}.0", device=6 + index)
        gpu["pci"] = {"rc": 0, "value": pci}
    return [line for k, v in gpu.items() if k not in NOT_ANSWERED for line in flatten(f"{index}.{k}", v)]


class Scenario:
    """A scenario file: the recorded GPU `gpus` times, then `set(...)` changes."""

    def __init__(self, path: Path, gpus: int = 1):
        recording = json.loads(RECORDING.read_text())
        self.path = Path(path)
        self.lines = [f"driver 0 {recording['driver']}", "cuda 0 13000", f"count 0 {gpus}",
                      f"event_set_create {recording['gpus'][0]['event_set_create']['rc']}"]
        for i in range(gpus):
            self.lines += gpu_lines(i)
        self.write()

    def set(self, key: str, value, rc: int = 0) -> "Scenario":
        """KEY (e.g. "0.remapped_rows.pending", "after.0.lost") answers VALUE with code RC."""
        self.lines = [line for line in self.lines if line.split()[0] != key] + [f"{key} {rc} {value}"]
        return self.write()

    def xid(self, gpu: int, xid: int, trigger: Path, delay_ms: int | None = None, **after) -> "Scenario":
        """GPU `gpu` reports XID `xid` once `trigger` exists (or `delay_ms` after the waiting process
        registered for it, which then creates `trigger`); from then on it answers `after`."""
        self.set(f"{gpu}.xid", xid).set(f"{gpu}.xid_file", trigger)
        if delay_ms is not None:
            self.set(f"{gpu}.xid_delay_ms", delay_ms)
        for key, value in after.items():
            self.set(f"after.{gpu}.{key.replace('__', '.')}", value)
        return self

    def write(self) -> "Scenario":
        self.path.write_text("\n".join(self.lines) + "\n")
        return self


def build_fake_nvml(directory: Path) -> Path:
    """tests/data/gpus/fake_nvml.c built as `directory`/libnvidia-ml.so.1; the directory returned."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in NVML")
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(directory / "libnvidia-ml.so.1"),
                    str(DATA / "fake_nvml.c")], check=True)
    return directory
