"""The canary's verdict: one instance read before and after its restart, judged. No I/O here.

A reading (canary.measure) holds what the instance answered alone: its greedy outputs, its acceptance
length (tokens per verify step), its decode speed (tokens/s after the first token), any request that
failed, and its identity (what /server_info says it serves, in three parts: model, drafter, stack).
`judge` fails the step when a request failed after the restart, when acceptance length or decode
speed fell below a ratio of what it was (`min_accept_ratio`, `min_speed_ratio`), or when greedy
outputs changed; the operator lifts a judgment by naming what is expected to change
(`expect_change`, data/canary.json's "expect"), never by default. A plain instance has no acceptance
length: speed, outputs and errors only. A figure that cannot be computed (nan, missing) never passes
a judgment it was held to: it fails where the figure before existed, and is a note where it did not.
"""

import math
from dataclasses import asdict, dataclass, field

from dflashctl.operations import unit_data

DATA = unit_data.canary_data()
DEFAULTS = DATA["defaults"]
EXPECT: dict[str, frozenset[str]] = {name: frozenset(v["relaxes"]) for name, v in DATA["expect"].items()}
PARTS: dict[str, list[str]] = DATA["identity"]  # part -> the /server_info fields that name it


@dataclass(frozen=True)
class CanarySettings:
    """What the canary asks and what it holds the answers to (CLI flags, the NixOS module's options)."""
    prompts: int = DEFAULTS["prompts"]
    tokens: int = DEFAULTS["tokens"]
    repeats: int = DEFAULTS["repeats"]
    min_accept_ratio: float = DEFAULTS["minAcceptRatio"]  # after / before acceptance length below it fails
    min_speed_ratio: float = DEFAULTS["minSpeedRatio"]  # after / before decode tokens/s below it fails
    expect_change: frozenset[str] = frozenset()  # keys of data/canary.json's "expect"
    enabled: bool = True  # False: --no-canary

    def relaxed(self) -> frozenset[str]:
        """The judgments (outputs, acceptance, speed) that expect_change lifts."""
        return frozenset().union(*(EXPECT[e] for e in self.expect_change))

    def to_json(self) -> dict:
        return {"prompts": self.prompts, "tokens": self.tokens, "repeats": self.repeats,
                "min_accept_ratio": self.min_accept_ratio, "min_speed_ratio": self.min_speed_ratio,
                "expect_change": sorted(self.expect_change)}


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x, digits: int = 3):
    """A figure for JSON: rounded, None for what is not a finite number (JSON has no nan)."""
    return round(float(x), digits) if finite(x) else None


@dataclass(frozen=True)
class Reading:
    """One canary against one instance (canary.measure), or what the rollout's state kept of it."""
    identity: dict  # part (model, drafter, stack) -> {field: value}
    outputs: list  # greedy ids per prompt (the first repeat's)
    accept_length: float | None = None  # tokens / verify steps over the prompts; None: plain, or not reported
    decode_tps: float | None = None  # decode tokens / decode seconds, each prompt's median over the repeats
    decode_tps_repeats: list = field(default_factory=list)  # each repeat's own figure: this reading's spread
    ttft_s: float | None = None  # median time to first token (not judged: the radix cache moves it)
    unstable: list = field(default_factory=list)  # prompts whose outputs differed between repeats
    errors: list = field(default_factory=list)  # the requests that failed (measure stops at the first)
    prompts: int = 0
    tokens: int = 0
    repeats: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("accept_length", "decode_tps", "ttft_s", "seconds"):
            d[k] = _num(d[k], 4)
        d["decode_tps_repeats"] = [_num(x, 1) for x in self.decode_tps_repeats]
        return d

    @classmethod
    def from_json(cls, d) -> "Reading":
        """A reading from to_json's object (the rollout's state file); ValueError when it is not one."""
        def number(x):
            return None if x is None else float(x)
        try:
            if not isinstance(d, dict) or not isinstance(d["identity"], dict):
                raise TypeError("not a reading object")
            outputs = [[int(t) for t in o] for o in d["outputs"]]
            return cls(identity={str(k): dict(v) for k, v in d["identity"].items()}, outputs=outputs,
                       accept_length=number(d.get("accept_length")), decode_tps=number(d.get("decode_tps")),
                       decode_tps_repeats=[number(x) for x in d.get("decode_tps_repeats", [])],
                       ttft_s=number(d.get("ttft_s")), unstable=[int(p) for p in d.get("unstable", [])],
                       errors=[str(e) for e in d.get("errors", [])], prompts=int(d.get("prompts", len(outputs))),
                       tokens=int(d.get("tokens", 0)), repeats=int(d.get("repeats", 0)),
                       seconds=float(d.get("seconds") or 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a saved canary reading that does not parse: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class Divergence:
    prompt: int
    position: int
    before: int | None  # None: that sequence had ended
    after: int | None

    def describe(self) -> str:
        return (f"prompt {self.prompt} first differs at token {self.position} "
                f"({self.before} before, {self.after} after)")


def first_divergence(before: list, after: list) -> Divergence | None:
    """The first token where two lists of outputs differ, over the prompts and tokens both hold."""
    for p, (a, b) in enumerate(zip(before, after)):
        n = min(len(a), len(b))
        at = next((i for i in range(n) if a[i] != b[i]), None)
        if at is not None:
            return Divergence(p, at, a[at], b[at])
    return None


def identity_changes(before: Reading, after: Reading) -> dict:
    """part -> {field: [before, after]} for every identity field whose value changed."""
    out = {}
    for part in sorted(set(before.identity) | set(after.identity)):
        b, a = before.identity.get(part) or {}, after.identity.get(part) or {}
        diff = {f: [b.get(f), a.get(f)] for f in sorted(set(b) | set(a)) if b.get(f) != a.get(f)}
        if diff:
            out[part] = diff
    return out


def _changed_text(changed: dict) -> str:
    if not changed:
        return ("although the model, its revision, the drafter and the stack did not change (as /server_info "
                "reports them): the new build decodes differently")
    fields = "; ".join(f"{f} {b!r} -> {a!r}" for part in changed.values() for f, (b, a) in part.items())
    return f"and the definition changed ({', '.join(changed)}: {fields})"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    compared: bool  # False: nothing from before the restart to compare with
    reasons: list  # why it failed; empty when ok
    notes: list  # what the operator should know although it did not fail
    acceptance: dict  # {"before", "after", "ratio", "min_ratio", "judged"}
    speed: dict  # decode tokens/s, the same keys
    outputs: dict  # {"verdict": identical | differs | not compared, "first_divergence", "expected"}
    changed: dict  # part -> {field: [before, after]}: what the two identities say changed
    expected: list  # the operator's expect_change
    fix: str  # empty when ok
    asked: dict  # prompts, tokens, repeats

    @property
    def word(self) -> str:
        return "failed" if not self.ok else "passed" if self.compared else "not compared"

    @property
    def failed_only_on_speed(self) -> bool:
        """Nothing but the decode speed held it back: the one figure a busy GPU moves (a reading again
        may tell a slower build from a moment of contention)."""
        s = self.speed
        return (not self.ok and self.compared and len(self.reasons) == 1 and bool(s.get("judged"))
                and s.get("ratio") is not None and s["ratio"] < s["min_ratio"])

    @property
    def what(self) -> str:
        """One sentence for a failed step: every reason."""
        return "the canary failed: " + "; ".join(self.reasons) if self.reasons else f"the canary {self.word}"

    def to_json(self) -> dict:
        return {"verdict": self.word, "ok": self.ok, "reasons": self.reasons, "notes": self.notes,
                "acceptance": self.acceptance, "decode_tps": self.speed, "outputs": self.outputs,
                "changed": self.changed, "expected": self.expected, "fix": self.fix or None, **self.asked}

    def summary(self) -> str:
        """One line for the table and the journal."""
        parts = [self.word]
        for name, f, unit in (("accept", self.acceptance, ""), ("decode", self.speed, " tok/s")):
            if f["before"] is None and f["after"] is None:
                continue
            ratio = f" ({f['ratio']:.2f}x{'' if f['judged'] else ', not judged'})" if f["ratio"] is not None else ""
            parts.append(f"{name} {_show(f['before'])} -> {_show(f['after'])}{unit}{ratio}")
        parts.append(f"outputs {self.outputs['verdict']}")
        if self.changed:
            parts.append("changed: " + ", ".join(self.changed))
        return ", ".join(parts)


def _show(x) -> str:
    """A figure for a sentence: 3 significant digits (16, 1.01), whole numbers from 100 (7166)."""
    return "-" if x is None else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _figure(before, after, min_ratio: float, judged: bool) -> dict:
    ratio = after / before if finite(before) and before > 0 and finite(after) else None
    return {"before": _num(before), "after": _num(after), "ratio": _num(ratio), "min_ratio": min_ratio,
            "judged": judged}


def _held(f: dict, what: str, unit: str, lost: str, reasons: list, notes: list) -> bool:
    """One ratio judgment; True when it failed. `lost`: why the figure after is missing."""
    b, a = f["before"], f["after"]
    to = reasons if f["judged"] else notes
    tail = "" if f["judged"] else " (expected)"
    if b is None or b <= 0:
        if a is not None:
            notes.append(f"{what} not compared: {_show(a)}{unit} after the restart, nothing before")
        return False
    if a is None:
        to.append(f"{what} not measured after the restart ({_show(b)}{unit} before): {lost}{tail}")
        return f["judged"]
    if f["ratio"] < f["min_ratio"]:
        to.append(f"{what} fell from {_show(b)} to {_show(a)}{unit} ({f['ratio']:.2f}x, below "
                  f"{f['min_ratio']:g}x){tail}")
        return f["judged"]
    return False


def _judge_outputs(before: Reading, after: Reading, changed: dict, judged: bool, reasons: list,
                   notes: list) -> tuple[dict, bool]:
    if (before.prompts, before.tokens) != (after.prompts, after.tokens):
        notes.append(f"outputs compared on what both canaries asked ({before.prompts} x {before.tokens} tokens "
                     f"before, {after.prompts} x {after.tokens} after)")
    if after.unstable:
        notes.append(f"greedy outputs differed between repeats after the restart (prompts {after.unstable}): "
                     "this build does not decode deterministically")
    d = first_divergence(before.outputs, after.outputs)
    if d is None:
        return {"verdict": "identical"}, False
    text = f"greedy outputs changed: {d.describe()}"
    (reasons if judged else notes).append(f"{text}, {_changed_text(changed)}" if judged else f"{text} (expected)")
    return {"verdict": "differs", "first_divergence": asdict(d), "expected": not judged}, judged


def _fix(failed: set[str], changed: dict, failed_before: bool) -> str:
    fixes = []
    if "errors" in failed and failed_before:
        fixes.append("the canary failed before the restart too: its requests may not suit this instance (more "
                     "--canary-tokens than its context length?); read the error and the instance's journal")
    elif "errors" in failed:
        fixes.append("read the instance's journal: the new build fails requests; roll back or fix it")
    if "acceptance" in failed:
        fixes.append("its drafter accepts less on the new build: check draftModel, its revision and the "
                     "speculative settings, and roll back; if that is intended, pass --canary-expect drafter")
    if "speed" in failed:
        fixes.append("it decodes slower on the new build, or the host was busy (a rerun with --resume tells): "
                     "roll back; if that is intended, pass --canary-expect speed (or a lower "
                     "--canary-min-speed-ratio)")
    if "outputs" in failed:
        parts = [p for p in ("model", "stack") if p in changed] or ["stack"]
        fixes.append("the same requests decode differently: roll back; if the new " + " or ".join(parts)
                     + " is meant to, pass " + " ".join(f"--canary-expect {p}" for p in parts))
    return "; ".join(fixes)


def _expected_but_same(expect: frozenset[str], changed: dict) -> list[str]:
    """A model or drafter declared as changing that /server_info reports unchanged: the new
    definition may not be the one running. (A stack can change without /server_info showing it.)"""
    return [f"--canary-expect {p} was given, but /server_info reports the same {p} before and after"
            for p in ("model", "drafter") if p in expect and p not in changed]


def judge(before: Reading | None, after: Reading, s: CanarySettings) -> Verdict:
    """The step's verdict. `before` None: the instance did not answer before its restart."""
    relaxed = s.relaxed()
    comparable = before is not None and not before.errors and not after.errors
    reasons, notes, failed = [], [], set()
    if after.errors:
        failed.add("errors")
        reasons.append(f"{len(after.errors)} canary request(s) failed after the restart: {after.errors[0]}")
    if before is None:
        notes.append("not compared: the instance did not answer the canary before its restart")
    elif before.errors:
        notes.append(f"not compared: the canary failed before the restart too ({before.errors[0]})")
    changed = identity_changes(before, after) if before is not None else {}
    b_acc, b_tps = (before.accept_length, before.decode_tps) if before is not None else (None, None)
    acc = _figure(b_acc, after.accept_length, s.min_accept_ratio, "acceptance" not in relaxed)
    spd = _figure(b_tps, after.decode_tps, s.min_speed_ratio, "speed" not in relaxed)
    outputs = {"verdict": "not compared"}
    if comparable:
        if _held(acc, "acceptance length", "", "speculative decoding is off, or its answers carry no "
                 "meta_info.spec_accept_length", reasons, notes):
            failed.add("acceptance")
        if _held(spd, "decode speed", " tokens/s", "the answers came in one piece (no streamed chunks "
                 "to time)", reasons, notes):
            failed.add("speed")
        outputs, differs = _judge_outputs(before, after, changed, "outputs" not in relaxed, reasons, notes)
        if differs:
            failed.add("outputs")
        notes += _expected_but_same(s.expect_change, changed)
    fix = _fix(failed, changed, failed_before=before is not None and bool(before.errors))
    return Verdict(ok=not reasons, compared=comparable, reasons=reasons, notes=notes, acceptance=acc, speed=spd,
                   outputs=outputs, changed=changed, expected=sorted(s.expect_change), fix=fix,
                   asked={"prompts": after.prompts, "tokens": after.tokens, "repeats": after.repeats})
