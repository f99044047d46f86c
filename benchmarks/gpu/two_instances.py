"""Two real DFLASH instances of the smoke's oracle pair on GPU 0, for rollout.sh and rollout_canary.sh.

    python3 benchmarks/gpu/two_instances.py WORK [--broken] [--fast-start | --default-fast-start]

Writes the pair into WORK/models and WORK/a.json, WORK/b.json (ports 31000, 31001). Both share the
one GPU: SGLang 0.5.11 sizes a pool as the free memory minus (1 - memFractionStatic) x the total, so
--max-total-tokens caps every pool (as the smoke does) and either can restart beside the other
(docs/service.md, "Sharing a GPU"). With --broken also the broken pair (its drafter reads one
position off, smoke's `--pair broken`), its drafter's path in WORK/broken-drafter. With --fast-start
both instances have `fastStart` on (SGLang's children forked from the preloaded template); with
--default-fast-start neither names it (the default: on, each has one GPU); else both have it off.
"""

import json
import sys
from pathlib import Path

from dflashctl.smoke import oracle
from dflashctl.smoke.settings import DEFAULT_SYNTHETIC_KV_TOKENS


def settings(name: str, port: int, pair, work: Path, fast_start: bool | None = False) -> dict:
    chosen = {} if fast_start is None else {"fastStart": fast_start}
    return {**chosen, "name": name, "model": str(pair.target), "draftModel": str(pair.draft), "port": port,
            "speculative": {"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
            "gpus": [0], "allowSharedGpus": True, "attentionBackend": "triton", "samplingBackend": "pytorch",
            "skipTokenizerInit": True, "grammarBackend": "none", "memFractionStatic": 0.25,
            "cudaGraphMaxBs": 8, "enableMetrics": True, "startTimeoutSec": 600,
            "extraArgs": ["--disable-piecewise-cuda-graph", "--max-total-tokens", str(DEFAULT_SYNTHETIC_KV_TOKENS)],
            "cacheDir": str(work / "cache")}


def main() -> None:
    work = Path(sys.argv[1])
    pair = oracle.write_pair(work / "models")
    if "--broken" in sys.argv[2:]:
        broken = oracle.write_pair(work / "models", oracle.OracleShape(draft_offset_error=1))
        (work / "broken-drafter").write_text(str(broken.draft))
    fast = True if "--fast-start" in sys.argv[2:] else None if "--default-fast-start" in sys.argv[2:] else False
    for name, port in (("a", 31000), ("b", 31001)):
        (work / f"{name}.json").write_text(json.dumps(settings(name, port, pair, work, fast), indent=2))


if __name__ == "__main__":
    main()
