"""The lossless check, end to end: speculative outputs against the baseline's, request by request.

At the default load (8 prompts x 256 tokens, as on the H200, where DFLASH's greedy outputs were
the baseline's token for token) the stand-in SGLang decodes the random pair alike in both servers;
a fault makes DFLASH differ at a chosen request and token, anywhere from the first to the last, or
the prompts go as text (what smoke sends a real pair).
"""

import json

import pytest

from lossless_load import LOAD, real_pair_args
from smoke_runner import prompts, smoke

from dflashctl import errors
from dflashctl.smoke import loadgen

N, SEQ, NEW = 8, 4, 256
DIVERGING_REQUEST = 3  # prompt 3 runs in both phases (the sequential phase sends prompts 0-3)
PROMPTS = prompts(8, 32, 0)


def diverging(at: int, request: int = DIVERGING_REQUEST, server: str = "DFLASH") -> list[dict]:
    return [{"kind": "diverge", "server": server, "prompt": PROMPTS[request], "at": at}]


def result_of(tmp_path) -> dict:
    return json.loads((tmp_path / "result.json").read_text())


def test_identical_outputs_are_lossless(tmp_path):
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", "--json", "result.json")
    assert p.returncode == 0, p.stderr
    result = result_of(tmp_path)
    base, dflash = result["runs"]
    assert base["lossless"] is None  # the baseline is what the others are compared with
    same = dflash["lossless"]
    assert same["status"] == "identical" and same["first_divergence"] is None
    assert (same["compared"], same["identical"], same["share_identical"]) == (12, 12, 1.0)
    assert same["mean_agreeing_prefix"] == same["mean_baseline_tokens"] == 256
    assert result["lossless_failures"] == [] and result["warnings"] == []
    row = next(line for line in p.stdout.splitlines() if line.startswith("DFLASH "))
    assert "12/12" in row.split()
    assert "lossless: DFLASH vs baseline: 12/12 requests identical, mean agreeing prefix 256 of 256 tokens" in p.stdout


def expected_divergence(same: dict, at: int) -> None:
    """Prompt 3 differs in both phases at token `at`: the sequential one is met first."""
    assert same["status"] == "diverged"
    assert (same["compared"], same["identical"]) == (12, 10)
    assert same["mean_agreeing_prefix"] == round((10 * 256 + 2 * at) / 12, 2)
    first = same["first_divergence"]
    assert (first["phase"], first["request"], first["position"]) == ("sequential", DIVERGING_REQUEST, at)
    assert first["token"] == (first["baseline_token"] + 1) % 151936  # the fault: one id off


@pytest.mark.parametrize("at", [0, 77, 255], ids=["first token", "middle", "last token"])
def test_synthetic_pair_that_diverges_fails_with_its_own_exit_code(tmp_path, at):
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", "--json", "result.json", faults=diverging(at))
    assert p.returncode == errors.NOT_LOSSLESS, p.stderr
    result = result_of(tmp_path)
    expected_divergence(result["runs"][1]["lossless"], at)
    assert not result["ok"] and result["failures"] == result["lossless_failures"]
    assert [r["ok"] for r in result["runs"]] == [True, False]
    assert "FAILED: DFLASH's greedy outputs differ from the baseline's: DFLASH vs baseline: 10/12 requests identical" \
        in p.stdout
    assert f"first difference: sequential request {DIVERGING_REQUEST}, token {at}" in p.stdout


def test_real_pair_that_diverges_warns(tmp_path):
    p = smoke(tmp_path, *LOAD, *real_pair_args(), "--runs", "baseline,DFLASH", "--json", "result.json",
              faults=[{"kind": "diverge", "server": "DFLASH", "at": 77}])
    assert p.returncode == 0, p.stderr
    result = result_of(tmp_path)
    assert result["ok"] and result["failures"] == [] and result["settings"]["prompts"] == "text"
    same = result["runs"][1]["lossless"]
    assert same["status"] == "diverged" and same["identical"] == 0
    assert same["mean_agreeing_prefix"] == 77 and same["first_divergence"]["position"] == 77
    assert len(result["warnings"]) == 1 and "--require-lossless makes it fatal" in result["warnings"][0]
    assert "WARNING: DFLASH's greedy outputs differ from the baseline's" in p.stdout


def test_real_pair_that_diverges_fails_with_require_lossless(tmp_path):
    p = smoke(tmp_path, *LOAD, *real_pair_args(), "--runs", "baseline,DFLASH", "--require-lossless",
              "--json", "result.json", faults=[{"kind": "diverge", "server": "DFLASH", "at": 255}])
    assert p.returncode == errors.NOT_LOSSLESS, p.stderr
    result = result_of(tmp_path)
    assert result["runs"][1]["lossless"]["first_divergence"]["position"] == 255
    assert result["warnings"] == [] and len(result["lossless_failures"]) == 1


def test_without_a_baseline_the_check_says_it_could_not_run(tmp_path):
    p = smoke(tmp_path, *LOAD, "--runs", "DFLASH", "--json", "result.json", faults=diverging(77))
    assert p.returncode == 0, p.stderr
    same = result_of(tmp_path)["runs"][0]["lossless"]
    assert same["status"] == "not checked" and "no baseline run" in same["reason"]
    assert "lossless: DFLASH not checked -- no baseline run" in p.stdout
    assert "identical" not in p.stdout


def test_require_lossless_without_a_baseline_is_a_usage_error(tmp_path):
    p = smoke(tmp_path, *LOAD, "--runs", "DFLASH", "--require-lossless")
    assert p.returncode == errors.USAGE
    assert "--require-lossless needs a baseline" in p.stderr and "started" not in p.stderr


def test_another_failure_takes_precedence_over_a_divergence(tmp_path):
    """A request that failed outright is the first thing to fix: exit 1, both listed."""
    faults = diverging(77) + [{"kind": "inactive", "server": "DFLASH"}]  # SGLang leaves spec_* out
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", "--json", "result.json", faults=faults)
    assert p.returncode == errors.FAILED, p.stderr
    result = result_of(tmp_path)
    assert len(result["lossless_failures"]) == 1 and len(result["failures"]) > 1


def test_answers_without_output_ids_are_not_checked_and_fail_require_lossless(tmp_path):
    """A server (or a proxy in front of it) that sends no output_ids: nothing to compare. Plain
    smoke says so; --require-lossless asked for proof and fails."""
    no_ids = [{"kind": "no-ids", "server": "DFLASH"}]
    p = smoke(tmp_path, *LOAD, *real_pair_args(), "--runs", "baseline,DFLASH", "--json", "result.json", faults=no_ids)
    assert p.returncode == 0, p.stderr
    same = result_of(tmp_path)["runs"][1]["lossless"]
    assert same["status"] == "not checked" and same["skipped"] == 12
    assert "lossless: DFLASH not checked -- no request of both runs carried its output token ids" in p.stdout
    p = smoke(tmp_path, *LOAD, *real_pair_args(), "--runs", "baseline,DFLASH", "--require-lossless",
              "--json", "result.json", faults=no_ids)
    assert p.returncode == errors.NOT_LOSSLESS, p.stdout + p.stderr
    result = result_of(tmp_path)
    assert result["lossless_failures"] == result["failures"] == [
        "DFLASH: --require-lossless, but its outputs could not be compared with the baseline's (no request "
        "of both runs carried its output token ids): nothing proves them lossless"]


def test_output_ids_from_cumulative_and_incremental_streams():
    """SGLang streams cumulative ids by default, deltas with --incremental-streaming-output."""
    def ids_of(chunks):
        deltas = []
        for k, c in enumerate(chunks, 1):
            deltas = loadgen._collect(deltas, c, k)
        return loadgen._output_ids(chunks[-1], deltas, loadgen._tokens_in(chunks[-1]))

    def chunk(ids, n):
        return {"output_ids": ids, "meta_info": {"completion_tokens": n}}
    assert ids_of([chunk([5], 1), chunk([5, 6, 7], 3), chunk([5, 6, 7, 8], 4)]) == [5, 6, 7, 8]
    assert ids_of([chunk([5], 1), chunk([6, 7], 3), chunk([8], 4)]) == [5, 6, 7, 8]
    assert ids_of([chunk([5], 1), chunk([6], 3)]) is None  # a chunk lost its ids: not comparable


# --- lossless.py on its own: what compare, describe, judge and cell make of given outputs -------

def runs(base_ids: dict | None, spec_ids: dict, algorithm="DFLASH"):
    """A baseline and a speculative run (report.RunResult) whose requests carry the given ids:
    {phase: {index: ids or None}}."""
    from dflashctl.smoke.loadgen import PhaseResult, RequestResult
    from dflashctl.smoke.report import RunResult

    def run(name, algo, phases):
        return RunResult(name, algo, "http://x", phases=[
            PhaseResult(p, 1, 1.0, [RequestResult(i, output_ids=ids) for i, ids in reqs.items()])
            for p, reqs in phases.items()])
    base = None if base_ids is None else run("baseline", None, base_ids)
    return base, run(algorithm, algorithm, spec_ids)


def test_compare_counts_each_request_and_finds_the_first_difference():
    from dflashctl.smoke import lossless
    base, spec = runs({"sequential": {0: [1, 2, 3, 4], 1: [5, 6, 7, 8]}, "concurrent": {0: [1, 2, 3, 4]}},
                      {"sequential": {0: [1, 2, 3, 4], 1: [5, 6, 9, 8]}, "concurrent": {0: [1, 2, 3, 5]}})
    assert lossless.compare(base, spec) == {
        "status": "diverged", "compared": 3, "identical": 1, "share_identical": 0.3333,
        "mean_agreeing_prefix": 3.0, "mean_baseline_tokens": 4.0, "skipped": 0,
        "first_divergence": {"phase": "sequential", "request": 1, "position": 2, "baseline_token": 7, "token": 9}}


def test_the_means_keep_two_decimals():
    from dflashctl.smoke import lossless
    base, spec = runs({"concurrent": {0: [1, 2, 3], 1: [4], 2: [5]}}, {"concurrent": {0: [1, 2, 9], 1: [4], 2: [6]}})
    figures = lossless.compare(base, spec)
    assert (figures["mean_agreeing_prefix"], figures["mean_baseline_tokens"]) == (1.0, 1.67)  # 3/3, 5/3
    base, spec = runs({"concurrent": {0: [1], 1: [2], 2: [3]}}, {"concurrent": {0: [1], 1: [9], 2: [9]}})
    assert lossless.compare(base, spec)["mean_agreeing_prefix"] == 0.33


def test_a_shorter_answer_diverges_where_it_ends():
    from dflashctl.smoke import lossless
    base, spec = runs({"concurrent": {0: [1, 2, 3]}}, {"concurrent": {0: [1, 2]}})
    d = lossless.compare(base, spec)["first_divergence"]
    assert (d["position"], d["baseline_token"], d["token"]) == (2, 3, None)
    base, spec = runs({"concurrent": {0: [1, 2]}}, {"concurrent": {0: [1, 2, 3]}})
    d = lossless.compare(base, spec)["first_divergence"]
    assert (d["position"], d["baseline_token"], d["token"]) == (2, None, 3)


def test_requests_lacking_ids_or_a_baseline_request_are_skipped():
    from dflashctl.smoke import lossless
    base, spec = runs({"concurrent": {0: [1], 1: None}}, {"concurrent": {0: [1], 1: [2], 2: [3]}, "sequential": {0: [1]}})
    same = lossless.compare(base, spec)
    assert (same["status"], same["compared"], same["identical"], same["skipped"]) == ("identical", 1, 1, 3)
    base, spec = runs({"concurrent": {0: None}}, {"concurrent": {0: [1]}})
    assert lossless.compare(base, spec) == {"status": "not checked", "skipped": 1,
                                            "reason": "no request of both runs carried its output token ids"}
    assert lossless.compare(None, spec) == {
        "status": "not checked",
        "reason": "no baseline run to compare with (add baseline to --runs, or --baseline-url with --url)"}


def test_describe_and_cell_say_it_in_one_line():
    from dflashctl.smoke import lossless
    base, spec = runs({"concurrent": {0: [1, 2], 1: [3, 4]}}, {"concurrent": {0: [1, 2], 1: [3, 5]}})
    figures = lossless.compare(base, spec)
    assert lossless.describe("DFLASH", figures) == (
        "DFLASH vs baseline: 1/2 requests identical, mean agreeing prefix 1.5 of 2 tokens; first difference: "
        "concurrent request 1, token 1 (baseline 4, DFLASH 5)")
    assert lossless.cell(figures) == "1/2"
    same = lossless.compare(*runs({"concurrent": {0: [1]}}, {"concurrent": {0: [1]}}))
    assert lossless.describe("DFLASH", same) == "DFLASH vs baseline: 1/1 requests identical, mean agreeing prefix 1 of 1 tokens"
    nothing = lossless.compare(None, spec)
    assert lossless.describe("DFLASH", nothing).startswith("DFLASH not checked -- no baseline run")
    assert lossless.cell(nothing) == lossless.cell(None) == "-"


@pytest.mark.parametrize("synthetic, require, fatal, warned", [
    (True, False, True, False), (False, False, False, True), (False, True, True, False), (True, True, True, False)])
def test_judge_fails_or_warns_a_difference(synthetic, require, fatal, warned):
    from dflashctl.smoke import lossless
    base, spec = runs({"concurrent": {0: [1, 2]}}, {"concurrent": {0: [1, 3]}})
    figures, failure, warning = lossless.judge(base, spec, synthetic, require)
    assert figures["status"] == "diverged"
    assert (failure is not None, warning is not None) == (fatal, warned)
    line = failure or warning
    assert line.startswith("DFLASH's greedy outputs differ from the baseline's: DFLASH vs baseline: 0/1")
    if warned:
        assert line.endswith("(bf16 near ties can do that with real weights; --require-lossless makes it fatal)")


def test_judge_passes_identical_outputs_and_leaves_the_baseline_alone():
    from dflashctl.smoke import lossless
    base, spec = runs({"concurrent": {0: [1, 2]}}, {"concurrent": {0: [1, 2]}})
    for synthetic, require in ((True, True), (False, False)):
        figures, failure, warning = lossless.judge(base, spec, synthetic, require)
        assert figures["status"] == "identical" and failure is None and warning is None
    assert lossless.judge(base, base, True, True) == (None, None, None)


def test_require_lossless_fails_what_could_not_be_compared():
    from dflashctl.smoke import lossless
    base, spec = runs({"concurrent": {0: None}}, {"concurrent": {0: [1]}})
    assert lossless.judge(base, spec, False, False)[1:] == (None, None)  # said, not failed
    assert lossless.judge(base, spec, True, False)[1:] == (None, None)
    _, failure, _ = lossless.judge(base, spec, False, True)
    assert failure == ("DFLASH: --require-lossless, but its outputs could not be compared with the baseline's "
                       "(no request of both runs carried its output token ids): nothing proves them lossless")
    base, spec = runs({"concurrent": {0: [1], 1: None}}, {"concurrent": {0: [1], 1: [2]}})
    _, failure, _ = lossless.judge(base, spec, False, True)
    assert failure == ("DFLASH: --require-lossless, but 1 of its requests could not be compared with the "
                       "baseline's (no output token ids in the answers)")
    assert lossless.judge(base, spec, False, False)[1:] == (None, None)
