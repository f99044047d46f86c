"""What a hung interpreter costs doctor: N probes that hang, each killed at the timeout.

    .venv/bin/python benchmarks/probe_bench.py [--probes 16] [--timeout 2]

Runs the real probe runner (child processes of this interpreter running probe_child's `hang`)
twice: all at once, as `run_probes` does now, and bounded by this host's cores, as it did before.
Prints a Markdown row per case for docs/benchmarks.md.
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from dflashctl.host import probes  # noqa: E402


def bounded_by_cores(wanted, timeout):
    workers = max(2, min(len(wanted), os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(probes.run_probe, sys.executable, p, a, timeout) for p, a in wanted.values()]
        return [f.result() for f in futures]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probes", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=2.0)
    a = ap.parse_args()
    wanted = {f"hang{i}": ("hang", "") for i in range(a.probes)}
    print(f"{a.probes} hanging probes, timeout {a.timeout:g} s, {os.cpu_count()} cores, "
          f"{probes.probe_slots(a.probes, probes.available_memory())} slots by memory")
    print("| runner | wall s | timeouts' worth |\n|---|---|---|")
    for name, run in (("all at once (now)", lambda: probes.run_probes(sys.executable, wanted, a.timeout)),
                      ("bounded by cores (before)", lambda: bounded_by_cores(wanted, a.timeout))):
        t0 = time.monotonic()
        run()
        took = time.monotonic() - t0
        print(f"| {name} | {took:.1f} | {took / a.timeout:.1f} |")


if __name__ == "__main__":
    main()
