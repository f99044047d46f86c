"""Acceptance with the oracle pair: what each speculative run must reach, and its histograms.

The oracle pair is exact (oracle.py): under greedy decoding the tokens each verify step commits
follow from the prompts alone. The oracle drafter is always right, so every step commits a whole
block (16: accept length 16.0 at the default 256 new tokens, the request's last step cut short); the poisoned drafter's steps are predicted by the same rule
(`oracle.verify_steps`). A run below its band means drafts that should have been accepted were
rejected: the draft path (feature capture, the drafter's KV, block positions, verify) is broken
on this host. A poisoned run above its band accepted drafts that are wrong by construction: the
server did not load the poisoned drafter, or verify accepts what the target would not produce.
"""

from dflashctl.smoke import oracle

ORACLE_SLACK = 0.5  # the oracle drafter's band starts this far under the rule: >= 15.5 at the default 16.0
POISONED_TOLERANCE = 1.0  # tokens per step either side of the rule's prediction (docs/smoke.md)
BROKEN = "drafts that should be accepted were rejected: the draft path is broken on this host"


def expectations(shape: oracle.OracleShape, runs: list[str], prompts: list[list[int]], sequential: int,
                 new_tokens: int, more_phases: dict[str, list[list[int]]] | None = None) -> dict:
    """run -> phase -> {"predicted", "min", "max"} for the oracle pair's speculative runs;
    `more_phases`: other phases' prompts, in order (the concurrency sweep's points)."""
    phase_prompts = {"concurrent": prompts}
    if sequential:
        phase_prompts["sequential"] = prompts[:sequential]
    phase_prompts.update(more_phases or {})
    out = {}
    for run in runs:
        if run not in ("DFLASH", "DDTREE", "DFLASH-poisoned"):
            continue
        poisoned = run == "DFLASH-poisoned"
        out[run] = {}
        for phase, ps in phase_prompts.items():
            predicted = round(oracle.expected_accept_length(shape, ps, new_tokens, poisoned), 4)
            if poisoned:
                band = (round(predicted - POISONED_TOLERANCE, 4), round(predicted + POISONED_TOLERANCE, 4))
            else:  # tokens / ceil((tokens - 1) / block): 16.0 at 256 tokens, 14.29 at 100, 16.06 at 257
                band = (round(predicted - ORACLE_SLACK, 4), None)
            out[run][phase] = {"predicted": predicted, "min": band[0], "max": band[1]}
    return out


def histogram(requests) -> dict:
    """Tokens committed per verify step, counted from the stream: SGLang sends a chunk after every
    decode step (stream_interval 1), so a request's chunks after the first (the prefill's token)
    are its verify steps. Exact when every request has as many such chunks as its spec_verify_ct;
    a client that read two steps as one chunk makes it approximate (`exact` false)."""
    counts: dict[int, int] = {}
    exact, steps = True, 0
    for r in requests:
        if r.error is not None or not r.commits:
            continue
        verify_steps = r.commits[1:]
        if r.commits[0] != 1 or len(verify_steps) != r.spec_verify_ct:
            exact = False
        for c in verify_steps:
            counts[c] = counts.get(c, 0) + 1
            steps += 1
    return {"tokens_per_step": {str(k): counts[k] for k in sorted(counts)}, "steps": steps, "exact": exact,
            "source": "streamed chunks (one per decode step), checked against meta_info.spec_verify_ct"}


def judge(run_name: str, stats: dict, expected: dict | None) -> tuple[dict | None, str | None]:
    """(figures, failure) for one run's phases against its expectations; None, None when none."""
    if not expected:
        return None, None
    figures, problems = {}, []
    for phase, band in expected.items():
        got = (stats.get(phase) or {}).get("accept_length")
        ok = got is not None and got >= band["min"] and (band["max"] is None or got <= band["max"])
        figures[phase] = {**band, "accept_length": got, "ok": ok}
        if not ok:
            problems.append((phase, got, band))
    if not problems:
        return {"ok": True, "phases": figures}, None
    text = "; ".join(f"{phase} accept length {got if got is not None else 'none'} "
                     f"(rule predicts {band['predicted']:g}, band {_band(band)})" for phase, got, band in problems)
    low = any(got is None or got < band["min"] for _, got, band in problems)
    if low:
        why = f"{run_name}: {BROKEN}: {text}"
    else:
        why = (f"{run_name}: more drafts accepted than the poisoned drafter gets right: {text}; the server "
               "did not load the poisoned drafter, or verify accepted tokens the target would not produce")
    return {"ok": False, "phases": figures}, why


def _band(band: dict) -> str:
    return f">= {band['min']:g}" if band["max"] is None else f"{band['min']:g}-{band['max']:g}"
