"""Speculative decoding must not change what greedy decoding produces: each speculative run's
output token ids against the baseline's, request by request (same phase, same prompt).

With the synthetic pair the target's dummy weights are the same in both servers, so a correct
speculative path reproduces plain decoding token for token (the H200 did, 8 x 256 tokens): any
difference is a bug. With a real pair bf16 verify and decode may round differently on near ties,
so there a difference is a warning unless --require-lossless asks for identity.
"""

from dataclasses import dataclass

IDENTICAL, DIVERGED, NOT_CHECKED = "identical", "diverged", "not checked"


@dataclass
class Pair:
    phase: str
    index: int
    baseline: list[int]
    speculative: list[int]

    def agreeing_prefix(self) -> int:
        n = 0
        for a, b in zip(self.baseline, self.speculative):
            if a != b:
                break
            n += 1
        return n


def _pairs(base, run) -> tuple[list[Pair], int]:
    """Requests both runs answered with their ids, and how many could not be compared."""
    pairs, skipped = [], 0
    base_phases = {p.name: {r.index: r for r in p.requests} for p in base.phases}
    for phase in run.phases:
        theirs = base_phases.get(phase.name, {})
        for r in phase.requests:
            b = theirs.get(r.index)
            if b is None or b.output_ids is None or r.output_ids is None:
                skipped += 1
            else:
                pairs.append(Pair(phase.name, r.index, b.output_ids, r.output_ids))
    return pairs, skipped


def compare(base, run) -> dict:
    """The lossless figures of one speculative run (`report.RunResult`s); base None: no baseline."""
    if base is None:
        return {"status": NOT_CHECKED, "reason": "no baseline run to compare with (add baseline to --runs, "
                                                 "or --baseline-url with --url)"}
    pairs, skipped = _pairs(base, run)
    if not pairs:
        return {"status": NOT_CHECKED, "skipped": skipped,
                "reason": "no request of both runs carried its output token ids"}
    same = [p for p in pairs if p.baseline == p.speculative]
    prefixes = [p.agreeing_prefix() for p in pairs]
    first = next((p for p in pairs if p.baseline != p.speculative), None)
    out = {
        "status": IDENTICAL if first is None else DIVERGED,
        "compared": len(pairs),
        "identical": len(same),
        "share_identical": round(len(same) / len(pairs), 4),
        "mean_agreeing_prefix": round(sum(prefixes) / len(pairs), 2),
        "mean_baseline_tokens": round(sum(len(p.baseline) for p in pairs) / len(pairs), 2),
        "skipped": skipped,
        "first_divergence": None,
    }
    if first is not None:
        pos = first.agreeing_prefix()
        out["first_divergence"] = {
            "phase": first.phase, "request": first.index, "position": pos,
            "baseline_token": first.baseline[pos] if pos < len(first.baseline) else None,
            "token": first.speculative[pos] if pos < len(first.speculative) else None,
        }
    return out


def describe(name: str, figures: dict) -> str:
    """One line for the report (after "lossless: ")."""
    if figures["status"] == NOT_CHECKED:
        return f"{name} not checked -- {figures['reason']}"
    head = (f"{name} vs baseline: {figures['identical']}/{figures['compared']} requests identical, "
            f"mean agreeing prefix {figures['mean_agreeing_prefix']:g} of {figures['mean_baseline_tokens']:g} tokens")
    d = figures["first_divergence"]
    if d is None:
        return head
    return (f"{head}; first difference: {d['phase']} request {d['request']}, token {d['position']} "
            f"(baseline {d['baseline_token']}, {name} {d['token']})")


def judge(base, run, synthetic: bool, require_lossless: bool) -> tuple[dict | None, str | None, str | None]:
    """(figures, failure, warning) of one run: figures None for the baseline itself; a difference
    fails the synthetic pair or with --require-lossless, and is a warning otherwise.
    --require-lossless asks for proof: requests that could not be compared (no output ids) fail it."""
    if run.algorithm is None:
        return None, None, None
    figures = compare(base, run)
    if require_lossless and figures["status"] == NOT_CHECKED:
        return figures, (f"{run.name}: --require-lossless, but its outputs could not be compared with the "
                         f"baseline's ({figures['reason']}): nothing proves them lossless"), None
    if require_lossless and figures["skipped"]:
        return figures, (f"{run.name}: --require-lossless, but {figures['skipped']} of its requests could not be "
                         "compared with the baseline's (no output token ids in the answers)"), None
    if figures["status"] != DIVERGED:
        return figures, None, None
    line = f"{run.name}'s greedy outputs differ from the baseline's: {describe(run.name, figures)}"
    if synthetic or require_lossless:
        return figures, line, None
    return figures, None, f"{line} (bf16 near ties can do that with real weights; --require-lossless makes it fatal)"


def cell(figures: dict | None) -> str:
    """The table's column: identical/compared, '-' for the baseline or when not checked."""
    if not figures or figures["status"] == NOT_CHECKED:
        return "-"
    return f"{figures['identical']}/{figures['compared']}"
