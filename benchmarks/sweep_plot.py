"""Plot a `dflashctl smoke --sweep` result: tokens/s and speed-up against concurrency, one line per run.

    python benchmarks/sweep_plot.py result.json --out docs/gpu/sweep-h200.png [--title TEXT]

Needs matplotlib (any recent release; it is not a dependency of dflashctl: `pip install matplotlib`
in any venv). Reads only the smoke's JSON (`runs[].phases["sweep C"]` through its `sweep` block),
so the plot can be redrawn from a kept result without a GPU. Top: output tokens/s of each run at C
requests in flight; bottom: each speculative run's speed-up over the baseline at the same point,
with the line at 1 where DFLASH stops paying, and the break-even point marked where there is one.
"""

import argparse
import json
import sys
from pathlib import Path


def series(result: dict) -> dict:
    """What the plot draws: per run, the concurrencies and the figures at each (None for a run
    that has no speed-up, the baseline); SystemExit when the result has no sweep."""
    sweep = result.get("sweep")
    if not sweep:
        raise SystemExit("the result holds no concurrency sweep: run `dflashctl smoke --sweep 1,2,4,... --json FILE`")
    runs = []
    for run in sweep["runs"]:
        pts = [p for p in run["points"] if p["output_tok_s"] is not None]
        runs.append({"name": run["name"], "concurrency": [p["concurrency"] for p in pts],
                     "tok_s": [p["output_tok_s"] for p in pts],
                     "speedup": None if run["algorithm"] is None else [p["speedup"] for p in pts],
                     "accept_length": [p["accept_length"] for p in pts],
                     "break_even": run.get("break_even"), "falls_below_at": run.get("falls_below_baseline_at")})
    ident = result.get("identity") or {}
    gpus = ident.get("gpus") or []
    where = f"{gpus[0]['name']}, " if gpus and gpus[0].get("name") else ""
    return {"runs": runs, "points": sweep["points"], "subtitle":
            f"{where}sglang {ident.get('sglang') or '?'}, {sweep['max_new_tokens']} new tokens per request, "
            f"greedy; oracle pair = this host's ceiling for DFLASH at block 16"}


def draw(s: dict, out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True, height_ratios=(3, 2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(s["runs"]):
        color = colors[i % len(colors)]  # one colour per run in both panels
        label = r["name"]
        if r["accept_length"] and r["accept_length"][0]:
            label += f" (accept length {r['accept_length'][0]:.1f})"
        top.plot(r["concurrency"], r["tok_s"], marker="o", color=color, label=label)
        if r["speedup"] is not None:
            bottom.plot(r["concurrency"], r["speedup"], marker="o", color=color, label=r["name"])
            if r["break_even"]:
                bottom.axvline(r["break_even"], color=color, linestyle=":", linewidth=1)
                bottom.annotate(f"break-even ~{r['break_even']:g}", (r["break_even"], 1.0), xytext=(4, 6),
                                textcoords="offset points", color=color, fontsize=8)
    bottom.axhline(1.0, color="black", linewidth=1, label="baseline (1x)")
    bottom.legend(fontsize=8)
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.set_xticks(s["points"], [str(c) for c in s["points"]])
        ax.grid(True, which="major", alpha=0.3)
    top.set_ylabel("output tokens/s")
    top.legend(fontsize=8)
    bottom.set_ylabel("x baseline")
    bottom.set_xlabel("concurrent requests")
    bottom.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=11)
    top.set_title(s["subtitle"], fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="the smoke's --json FILE")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="dflashctl smoke --sweep: where DFLASH stops paying")
    a = ap.parse_args(argv)
    s = series(json.loads(Path(a.result).read_text()))
    draw(s, Path(a.out), a.title)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
