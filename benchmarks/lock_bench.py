"""Wall time of `dflashctl lock` (both systems) against a bare `uv lock` of the same spec.

    python benchmarks/lock_bench.py [--runs 5] [--spec nix/stack.toml] [--append docs/benchmarks.md]

Runs are interleaved in ABBA order (dflashctl, uv, uv, dflashctl, ...) so cache state and network weather hit
both alike; uv's cache is warm for both after the first pair. The bare run uses the same throw-away
pyproject.toml that dflashctl writes, minus everything dflashctl adds (the closure walk per system,
wheel choice, torch metadata for the contract, writing the lock). Goal: median ratio <= 1.2.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from dflashctl.lock import lockfile, resolver, spec as specmod  # noqa: E402


def timed(cmd, **kw) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, **kw)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--spec", type=Path, default=REPO / "nix/stack.toml")
    ap.add_argument("--append", type=Path, help="append a markdown section to this file")
    args = ap.parse_args()
    spec = specmod.load(args.spec)
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", PYTHONPATH=str(REPO / "python"))
    ours, bare = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "bare").mkdir()
        (tmp / "bare" / "pyproject.toml").write_text(resolver.project_toml(spec))
        uv = [resolver.uv_binary(), "lock", "--python", sys.executable, "--directory", str(tmp / "bare")]
        ctl = [sys.executable, "-m", "dflashctl", "lock", "-q", "--spec", str(args.spec),
               "--lock", str(tmp / "lock.json")]
        timed(uv, env=env)  # warm uv's cache once; not counted
        for i in range(args.runs):
            (tmp / "bare" / "uv.lock").unlink(missing_ok=True)  # else uv only re-validates it
            (tmp / "lock.json").unlink(missing_ok=True)
            # ABBA order: whichever runs second finds uv's HTTP cache just revalidated.
            pair = [(ours, ctl), (bare, uv)] if i % 2 == 0 else [(bare, uv), (ours, ctl)]
            for times, cmd in pair:
                times.append(timed(cmd, env=env))
            print(f"run {i + 1}/{args.runs}: dflashctl {ours[-1]:.2f} s, uv {bare[-1]:.2f} s",
                  file=sys.stderr)
        lock = lockfile.load(tmp / "lock.json")
    sizes = {s: sum(w.size for w in p.values()) for s, p in sorted(lock.systems.items())}
    result = {
        "runs": args.runs,
        "dflashctl_median_s": round(statistics.median(ours), 2),
        "uv_median_s": round(statistics.median(bare), 2),
        "ratio": round(statistics.median(ours) / statistics.median(bare), 3),
        "overhead_s": round(statistics.median(ours) - statistics.median(bare), 2),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "dflashctl_s": [round(t, 2) for t in ours],
        "uv_s": [round(t, 2) for t in bare],
        "systems": {s: {"packages": len(lock.systems[s]), "download_bytes": b} for s, b in sizes.items()},
    }
    print(json.dumps(result, indent=2))
    if args.append:
        with open(args.append, "a") as f:
            f.write(markdown(args, result))
        print(f"appended to {args.append}", file=sys.stderr)


def markdown(args, result: dict) -> str:
    """The section `--append` adds to docs/benchmarks.md."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = "\n".join(f"| {s} | {v['packages']} | {v['download_bytes']:,} B ({v['download_bytes'] / 2**30:.2f} GiB) |"
                     for s, v in result["systems"].items())
    section = f"""
## dflashctl lock

`python benchmarks/lock_bench.py --runs {args.runs}` on {when}, {platform.machine()}, {os.cpu_count()} CPUs,
Python {platform.python_version()}, load average {' / '.join(map(str, result['load_average']))} (1/5/15 min) at the end, uv's cache warm (first pair not counted), spec `{args.spec.relative_to(REPO) if args.spec.is_relative_to(REPO) else args.spec}`.
Interleaved runs in ABBA order; `dflashctl lock` resolves both systems, checks the ABI contract (fetching torch's
metadata per system) and writes the lock; the bare resolver is `uv lock` on the same generated pyproject.

| | median | runs |
|---|---|---|
| `dflashctl lock` | {result['dflashctl_median_s']:.2f} s | {', '.join(f'{t:.2f}' for t in result['dflashctl_s'])} |
| bare `uv lock` | {result['uv_median_s']:.2f} s | {', '.join(f'{t:.2f}' for t in result['uv_s'])} |
| ratio | **{result['ratio']:.2f}x** (goal <= 1.2x), {result['overhead_s']:+.2f} s | |

Total download size from the lock:

| system | packages | wheels |
|---|---|---|
{rows}
"""
    return section


if __name__ == "__main__":
    main()
