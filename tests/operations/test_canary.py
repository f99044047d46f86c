"""The canary's verdict over readings, and its settings from the rollout's flags (no server here:
tests/operations/test_canary_measure.py reads real stand-in instances over HTTP).

Each judgment is held at its threshold from both sides, each reason and each expect_change word is
shown to change the verdict, and figures that are not numbers never pass a judgment they are held to.
"""

import argparse
import json
import math

import pytest

from dflashctl.errors import CONFIG, DflashError
from dflashctl.operations import canary
from dflashctl.operations.canary import CanarySettings, Reading, judge
from dflashctl.operations.canary_verdict import DATA, EXPECT, PARTS

from smoke_runner import DATA as SMOKE_DATA

OUT = [[11, 12, 13, 14], [21, 22, 23, 24]]
IDENTITY = {"model": {"model_path": "/models/qwen3-8b", "revision": "abc"},
            "drafter": {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": "/models/drafter"},
            "stack": {"version": "0.5.11", "attention_backend": "fa3"}}


def reading(accept=6.0, tps=1000.0, outputs=None, errors=(), identity=None, **kw) -> Reading:
    ident = json.loads(json.dumps(identity if identity is not None else IDENTITY))
    return Reading(identity=ident, outputs=[list(o) for o in (outputs or OUT)], accept_length=accept,
                   decode_tps=tps, errors=list(errors), prompts=len(outputs or OUT), tokens=4, repeats=3, **kw)


def plain(**kw) -> Reading:
    ident = {**IDENTITY, "drafter": {"speculative_algorithm": None}}
    return reading(accept=None, identity=ident, **kw)


def with_identity(part: str, **fields) -> dict:
    ident = json.loads(json.dumps(IDENTITY))
    ident[part].update(fields)
    return ident


S = CanarySettings()


def test_an_identical_build_passes_and_says_so():
    v = judge(reading(), reading(), S)
    assert v.ok and v.word == "passed" and v.reasons == [] and v.fix == ""
    assert v.acceptance == {"before": 6.0, "after": 6.0, "ratio": 1.0, "min_ratio": S.min_accept_ratio, "judged": True}
    assert v.speed["ratio"] == 1.0 and v.outputs == {"verdict": "identical"} and v.changed == {}
    assert v.summary() == "passed, accept 6 -> 6 (1.00x), decode 1000 -> 1000 tok/s (1.00x), outputs identical"
    json.dumps(v.to_json(), allow_nan=False)


@pytest.mark.parametrize("after, ok", [(6.0 * 0.9, True), (6.0 * 0.9 - 0.01, False), (1.03, False), (7.0, True)])
def test_acceptance_is_held_at_its_ratio(after, ok):
    v = judge(reading(accept=6.0), reading(accept=after), S)
    assert v.ok is ok
    assert any(r.startswith("acceptance length fell from 6 to") for r in v.reasons) is not ok
    if not ok:
        assert "--canary-expect drafter" in v.fix and "below 0.9x" in v.what


@pytest.mark.parametrize("after, ok", [(800.0, True), (799.0, False), (190.0, False), (1500.0, True)])
def test_decode_speed_is_held_at_its_ratio(after, ok):
    v = judge(reading(tps=1000.0), reading(tps=after), S)
    assert v.ok is ok
    assert any(r.startswith("decode speed fell from 1000 to") for r in v.reasons) is not ok
    if not ok:
        assert "--canary-expect speed" in v.fix


def test_the_thresholds_are_the_settings_not_constants():
    loose = CanarySettings(min_accept_ratio=0.25, min_speed_ratio=0.3)
    assert judge(reading(accept=6.0, tps=1000), reading(accept=2.0, tps=400), loose).ok
    tight = CanarySettings(min_accept_ratio=0.99, min_speed_ratio=0.95)
    v = judge(reading(accept=6.0, tps=1000), reading(accept=5.9, tps=940), tight)
    assert len(v.reasons) == 2 and v.acceptance["min_ratio"] == 0.99 and v.speed["min_ratio"] == 0.95


def test_the_h200_broken_drafter_fails_on_both_and_names_each():
    """The rollout that reached every instance: 16 -> 1.03, 109 -> 19 requests/s, outputs identical."""
    before = reading(accept=16.0, tps=4100.0)
    after = reading(accept=1.03, tps=270.0,
                    identity=with_identity("drafter", speculative_draft_model_path="/models/broken"))
    v = judge(before, after, S)
    assert not v.ok and v.outputs == {"verdict": "identical"}
    assert v.reasons == ["acceptance length fell from 16 to 1.03 (0.06x, below 0.9x)",
                         "decode speed fell from 4100 to 270 tokens/s (0.07x, below 0.8x)"]
    assert v.changed == {"drafter": {"speculative_draft_model_path": ["/models/drafter", "/models/broken"]}}
    assert v.summary().startswith("failed, accept 16 -> 1.03 (0.06x), decode 4100 -> 270 tok/s (0.07x)")
    assert v.summary().endswith("changed: drafter")


def test_outputs_that_change_with_nothing_else_changed_fail_and_say_nothing_else_did():
    v = judge(reading(), reading(outputs=[[11, 12, 13, 14], [21, 22, 99, 24]]), S)
    assert not v.ok and len(v.reasons) == 1
    assert v.reasons[0].startswith("greedy outputs changed: prompt 1 first differs at token 2 (23 before, 99 after), "
                                   "although the model, its revision, the drafter and the stack did not change")
    assert v.outputs["first_divergence"] == {"prompt": 1, "position": 2, "before": 23, "after": 99}
    assert "--canary-expect stack" in v.fix


def test_outputs_that_change_with_the_model_name_what_changed():
    after = reading(outputs=[[11, 0, 0, 0], OUT[1]], identity=with_identity("model", revision="def"))
    v = judge(reading(), after, S)
    assert not v.ok and "the definition changed (model: revision 'abc' -> 'def')" in v.reasons[0]
    assert v.fix.endswith("pass --canary-expect model") and v.changed == {"model": {"revision": ["abc", "def"]}}


def test_outputs_expected_to_change_pass_with_a_note():
    s = CanarySettings(expect_change=frozenset({"outputs"}))
    v = judge(reading(), reading(outputs=[[11, 12, 13, 15], OUT[1]]), s)
    assert v.ok and v.outputs["verdict"] == "differs" and v.outputs["expected"] is True
    assert v.notes == ["greedy outputs changed: prompt 0 first differs at token 3 (14 before, 15 after) (expected)"]


@pytest.mark.parametrize("word", sorted(EXPECT))
def test_each_expected_change_lifts_exactly_its_judgments(word):
    """Every word of data/canary.json against a build that fails all three judgments."""
    new = {"model": {"model_path": "/models/other"}, "drafter": {"speculative_draft_model_path": "/d2"}}
    ident = json.loads(json.dumps(IDENTITY))
    for part, fields in new.items():
        ident[part].update(fields)
    after = reading(accept=2.0, tps=300.0, outputs=[[11, 12, 0, 0], OUT[1]], identity=ident)
    v = judge(reading(), after, CanarySettings(expect_change=frozenset({word})))
    failed = {name for name, start in (("acceptance", "acceptance length fell"), ("speed", "decode speed fell"),
                                       ("outputs", "greedy outputs changed")) if any(r.startswith(start)
                                                                                     for r in v.reasons)}
    assert failed == {"acceptance", "speed", "outputs"} - EXPECT[word], v.reasons
    assert v.ok is (EXPECT[word] == {"acceptance", "speed", "outputs"}) and v.expected == [word]
    assert ("--canary-expect speed" in v.fix) is ("speed" in failed)  # a fix for what failed only
    assert ("--canary-expect drafter" in v.fix) is ("acceptance" in failed)


def test_a_new_drafter_may_accept_less_but_must_not_change_outputs():
    """DFLASH is lossless: whatever the drafter, the target decides every token."""
    s = CanarySettings(expect_change=frozenset({"drafter"}))
    assert judge(reading(accept=6.0, tps=1000), reading(accept=3.0, tps=600), s).ok
    assert not judge(reading(), reading(outputs=[[11, 12, 13, 0], OUT[1]]), s).ok


def test_a_model_or_drafter_expected_to_change_that_did_not_is_noted():
    s = CanarySettings(expect_change=frozenset({"model", "drafter", "stack"}))
    v = judge(reading(), reading(), s)
    assert v.ok and v.notes == [
        "--canary-expect model was given, but /server_info reports the same model before and after",
        "--canary-expect drafter was given, but /server_info reports the same drafter before and after"]
    moved = judge(reading(), reading(identity=with_identity("model", model_path="/new")), s)
    assert moved.notes == [n for n in v.notes if "drafter" in n]


def test_a_failed_request_after_the_restart_fails_whatever_the_figures():
    after = reading(errors=["prompt 2 (repeat 1): HTTP 400: input too long"], accept=None, tps=None, outputs=[[]])
    v = judge(reading(), after, S)
    assert not v.ok and v.reasons == ["1 canary request(s) failed after the restart: prompt 2 (repeat 1): HTTP 400: "
                                      "input too long"]
    assert v.outputs == {"verdict": "not compared"} and "journal" in v.fix
    assert v.acceptance["before"] == 6.0 and v.acceptance["ratio"] is None


def test_nothing_before_the_restart_is_not_compared_but_errors_still_fail():
    v = judge(None, reading(), S)
    assert v.ok and v.word == "not compared" and v.notes[0].startswith("not compared: the instance did not answer")
    assert v.summary() == "not compared, accept - -> 6, decode - -> 1000 tok/s, outputs not compared"
    assert not judge(None, reading(errors=["the warm-up request: HTTP 503"]), S).ok
    broken_before = judge(reading(errors=["HTTP 500"], accept=None, tps=None), reading(), S)
    assert broken_before.ok and not broken_before.compared and "failed before the restart too" in broken_before.notes[0]
    both = judge(reading(errors=["HTTP 400: too long"], accept=None, tps=None), reading(errors=["HTTP 400: too long"]), S)
    assert not both.ok and both.fix.startswith("the canary failed before the restart too: its requests may not suit")


def test_plain_instances_are_held_to_speed_only():
    v = judge(plain(), plain(), S)
    assert v.ok and v.acceptance["before"] is None and "accept" not in v.summary()
    slow = judge(plain(tps=1000), plain(tps=500), S)
    assert not slow.ok and len(slow.reasons) == 1 and slow.reasons[0].startswith("decode speed fell")
    assert not judge(plain(), plain(outputs=[[1, 2, 3, 4], OUT[1]]), S).ok  # outputs still


def test_speculative_decoding_lost_in_the_restart_fails_on_acceptance():
    v = judge(reading(accept=6.0), plain(), S)
    assert not v.ok and v.reasons[0].startswith("acceptance length not measured after the restart (6 before): "
                                                "speculative decoding is off")
    gained = judge(plain(), reading(accept=6.0), S)
    assert gained.ok and gained.notes == ["acceptance length not compared: 6 after the restart, nothing before"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_a_figure_after_that_is_not_a_number_never_passes(bad):
    for field, start in (("accept", "acceptance length not measured"), ("tps", "decode speed not measured")):
        v = judge(reading(), reading(**{field: bad}), S)
        assert not v.ok and v.reasons[0].startswith(start), (field, bad, v.reasons)
        json.dumps(v.to_json(), allow_nan=False)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -3.0, None])
def test_a_figure_before_that_is_not_a_number_is_not_compared(bad):
    v = judge(reading(tps=bad), reading(tps=900.0), S)
    assert v.ok and v.speed["ratio"] is None
    json.dumps(v.to_json(), allow_nan=False)


def test_outputs_of_different_lengths_are_compared_on_what_both_asked():
    before = reading(outputs=[[1, 2, 3, 4], [5, 6, 7, 8]])
    shorter = Reading(identity=json.loads(json.dumps(IDENTITY)), outputs=[[1, 2]], accept_length=6.0,
                      decode_tps=1000.0, prompts=1, tokens=2, repeats=3)
    v = judge(before, shorter, S)
    assert v.ok and v.notes == ["outputs compared on what both canaries asked (2 x 4 tokens before, 1 x 2 after)"]
    assert not judge(before, Reading(**{**shorter.__dict__, "outputs": [[1, 9]]}), S).ok


def test_outputs_that_differ_between_repeats_are_noted():
    v = judge(reading(), reading(unstable=[1]), S)
    assert v.ok and "this build does not decode deterministically" in v.notes[0]


def test_a_reading_survives_the_state_file_and_garbage_does_not_pass_for_one():
    r = reading(decode_tps_repeats=[990.0, math.nan, 1010.0], ttft_s=0.01, unstable=[0], seconds=1.5)
    text = json.dumps(r.to_json(), allow_nan=False)
    back = Reading.from_json(json.loads(text))
    assert back.to_json() == r.to_json() and back.decode_tps_repeats == [990.0, None, 1010.0]
    assert judge(back, reading(), S).ok
    nan_reading = Reading.from_json({**r.to_json(), "decode_tps": float("nan")})
    assert judge(nan_reading, reading(), S).speed["ratio"] is None
    for bad in (None, [], {"outputs": []}, {"identity": {}, "outputs": [["x"]]}, {"identity": [], "outputs": []},
                {**r.to_json(), "decode_tps": "fast"}):
        with pytest.raises(ValueError, match="a saved canary reading that does not parse"):
            Reading.from_json(bad)


def test_the_identity_fields_are_sglang_0_5_11s_own():
    """Every field the canary reads is in /server_info as SGLang 0.5.11 answered it on the H200."""
    for recording in ("h200-oracle/DFLASH.json", "h200-oracle/baseline.json", "h200-broken/DFLASH.json"):
        info = json.loads((SMOKE_DATA / recording).read_text())["server_info"]
        missing = [f for fields in PARTS.values() for f in fields if f not in info]
        assert not missing, (recording, missing)


def test_the_expect_words_lift_only_what_the_verdict_judges():
    assert set(EXPECT) == set(DATA["expect"]) and len(EXPECT) >= 6
    assert all(lifted and lifted <= {"outputs", "acceptance", "speed"} for lifted in EXPECT.values())
    assert EXPECT["drafter"] == {"acceptance", "speed"}  # never outputs: DFLASH is lossless


# --- the flags ----------------------------------------------------------------------------------------
def parse(*argv: str):
    p = argparse.ArgumentParser()
    canary.add_arguments(p)
    return canary.settings_of(p.parse_args(list(argv)))


def test_the_defaults_come_from_the_data_file():
    d = DATA["defaults"]
    assert parse() == CanarySettings(prompts=d["prompts"], tokens=d["tokens"], repeats=d["repeats"],
                                     min_accept_ratio=d["minAcceptRatio"], min_speed_ratio=d["minSpeedRatio"])
    assert parse("--no-canary").enabled is False


def test_the_flags_set_what_they_name():
    s = parse("--canary-prompts", "2", "--canary-tokens", "64", "--canary-repeats", "5", "--canary-min-accept-ratio",
              "0.5", "--canary-min-speed-ratio", "0.7", "--canary-expect", "model,speed", "--canary-expect", "stack")
    assert s == CanarySettings(prompts=2, tokens=64, repeats=5, min_accept_ratio=0.5, min_speed_ratio=0.7,
                               expect_change=frozenset({"model", "speed", "stack"}))


@pytest.mark.parametrize("argv, names", [
    (["--canary-min-accept-ratio", "nan"], "--canary-min-accept-ratio nan"),
    (["--canary-min-accept-ratio", "inf"], "--canary-min-accept-ratio inf"),
    (["--canary-min-speed-ratio", "1"], "--canary-min-speed-ratio 1.0"),
    (["--canary-min-speed-ratio", "0"], "--canary-min-speed-ratio 0.0"),
    (["--canary-min-speed-ratio", "-0.5"], "--canary-min-speed-ratio -0.5"),
    (["--canary-min-speed-ratio", "1.5"], "--canary-min-speed-ratio 1.5"),
    (["--canary-tokens", "1000000000"], "--canary-tokens 1000000000"),
    (["--canary-tokens", "1"], "--canary-tokens 1"),
    (["--canary-prompts", "0"], "--canary-prompts 0"),
    (["--canary-repeats", "-1"], "--canary-repeats -1"),
    (["--canary-expect", "everything"], "--canary-expect everything"),
    (["--no-canary", "--canary-expect", "model"], "--no-canary and --canary-expect"),
    (["--no-canary", "--canary-tokens", "64"], "--no-canary and --canary-tokens"),
])
def test_nonsense_is_refused_with_the_config_exit_code_and_a_fix(argv, names):
    with pytest.raises(DflashError) as e:
        parse(*argv)
    assert e.value.exit_code == CONFIG and e.value.what.startswith(names), e.value.what
    assert e.value.why and e.value.fix


def test_what_is_not_a_number_is_argparse_s_usage_error():
    with pytest.raises(SystemExit) as e:
        parse("--canary-min-speed-ratio", "fast")
    assert e.value.code == 2


def test_only_a_decode_speed_below_the_bar_counts_as_failed_only_on_speed():
    before = reading()
    assert judge(before, reading(tps=700.0), S).failed_only_on_speed
    assert not judge(before, reading(tps=900.0), S).failed_only_on_speed  # passed
    assert not judge(before, reading(accept=1.0, tps=700.0), S).failed_only_on_speed  # acceptance too
    assert not judge(before, reading(tps=700.0, errors=["HTTP 500"]), S).failed_only_on_speed
    relaxed = canary.CanarySettings(**{**S.__dict__, "expect_change": frozenset({"speed"})})
    assert not judge(before, reading(tps=100.0), relaxed).failed_only_on_speed  # not judged


class _Host:
    """What Rollout.judge_after reads of the rollout: its options."""
    def __init__(self):
        from dflashctl.operations.rollout_machine import Options
        self.opts = Options(canary=S)


@pytest.mark.parametrize("speeds, ok, rechecks", [
    ([700.0, 950.0], True, 1),          # a moment of contention: the second reading passes
    ([700.0, 650.0, 760.0], False, 2),  # slower every time: fails, with the best of the three
    ([100.0, 100.0, 100.0], False, 2),
    ([990.0], True, 0),                 # passed at once: read once
])
def test_a_speed_only_failure_is_read_again_and_the_best_reading_counts(monkeypatch, speeds, ok, rechecks):
    from types import SimpleNamespace

    from dflashctl.operations import rollout_machine
    readings = iter(reading(tps=x) for x in speeds)
    monkeypatch.setattr(rollout_machine.canary, "measure", lambda *a, **k: next(readings))
    target = SimpleNamespace(name="gpu0", cfg=SimpleNamespace(base_url="http://127.0.0.1:1"))
    verdict, n = rollout_machine.Rollout.judge_after(_Host(), target, None, reading())
    assert (verdict.ok, n) == (ok, rechecks)
    assert verdict.speed["after"] == pytest.approx(max(speeds[:rechecks + 1]))
    assert next(readings, None) is None  # no reading more than needed


def test_an_acceptance_drop_is_not_read_again(monkeypatch):
    from types import SimpleNamespace

    from dflashctl.operations import rollout_machine
    calls = []
    monkeypatch.setattr(rollout_machine.canary, "measure", lambda *a, **k: calls.append(1) or reading(accept=1.0, tps=60.0))
    target = SimpleNamespace(name="gpu0", cfg=SimpleNamespace(base_url="http://127.0.0.1:1"))
    verdict, n = rollout_machine.Rollout.judge_after(_Host(), target, None, reading())
    assert not verdict.ok and n == 0 and len(calls) == 1


def test_a_restarted_instance_is_ready_for_its_canary_without_health_generates_second(tmp_path):
    """decodes_now: one token of ours through /generate answers once decoded; /health_generate (here
    sleeping far longer, as SGLang 0.5.11's sleeps its second) would hold the rollout up."""
    from router_harness import Standin, free_port
    ok = tmp_path / "ok"
    worker = Standin(free_port(), tmp_path, STANDIN_HEALTH_SECONDS="600", STANDIN_OK_FILE=str(ok)).start()
    try:
        assert canary.decodes_now(worker.url, None, timeout=30)
        assert ok.read_text().splitlines() == ["200 /generate auth=None"]
        assert not canary.decodes(worker.url, None, timeout=1)  # still in its sleep
    finally:
        worker.stop()
    assert not canary.decodes_now(worker.url, None, timeout=2)  # nothing listens


def test_an_instance_that_refuses_the_readiness_token_is_asked_health_generate(tmp_path):
    """A build whose context is shorter than our token's prompt answers 400: readiness falls back to
    /health_generate, so the rollout reaches the canary, which names the refusal, instead of waiting
    for the ready timeout."""
    from router_harness import Standin, free_port
    ok = tmp_path / "ok"
    worker = Standin(free_port(), tmp_path, STANDIN_CONTEXT="8", STANDIN_OK_FILE=str(ok)).start()
    try:
        assert canary.decodes_now(worker.url, None, timeout=30)
        assert ok.read_text().splitlines() == ["200 /health_generate auth=None"]
    finally:
        worker.stop()
