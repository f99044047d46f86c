"""The lossless check, end to end over the greedy outputs SGLang 0.5.11 recorded on an H200.

tests/data/smoke/h200 holds baseline and DFLASH responses of the default smoke (8 prompts x 256
tokens, identical ids). The stand-in SGLang replays them; the edits below make DFLASH differ at a
known request and token, or give the prompts as text (what smoke sends a real pair).
"""

import json

from test_smoke import DATA, smoke

from dflashctl import errors
from dflashctl.smoke import loadgen

H200 = DATA / "h200"
REC = json.loads((H200 / "DFLASH.json").read_text())["settings"]
LOAD = ["--requests", str(REC["requests"]), "--sequential-requests", str(REC["sequential_requests"]),
        "--max-new-tokens", str(REC["max_new_tokens"]), "--input-len", str(REC["input_len"]),
        "--seed", str(REC["seed"]),
        "--no-grammar"]  # the H200 recordings predate the grammar phase: token ids, no tokenizer
N, SEQ, NEW = REC["requests"], REC["sequential_requests"], REC["max_new_tokens"]
DIVERGING_REQUEST, DIVERGING_TOKEN = 3, 77  # prompt 3 runs in both phases


def h200(tmp_path, diverge=False, text=False):
    """A copy of the H200 recordings; DFLASH's prompt 3 changed at token 77, prompts as text."""
    out = tmp_path / "h200"
    out.mkdir(exist_ok=True)
    texts = loadgen.text_prompts(N)
    for run in ("baseline", "DFLASH"):
        doc = json.loads((H200 / f"{run}.json").read_text())
        for i, g in enumerate(doc["generate"]):
            if text:
                g["request"].pop("input_ids")
                g["request"]["text"] = texts[i]
            if diverge and run == "DFLASH" and i == DIVERGING_REQUEST:
                g["final"]["output_ids"][DIVERGING_TOKEN] += 1
        (out / f"{run}.json").write_text(json.dumps(doc))
    return out


def result_of(tmp_path) -> dict:
    return json.loads((tmp_path / "result.json").read_text())


def real_pair_args():
    return ["--model", "Qwen/Qwen3-8B", "--draft-model", "z-lab/Qwen3-8B-DFlash-b16"]


def test_identical_outputs_are_lossless(tmp_path):
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", "--json", "result.json", recs=h200(tmp_path))
    assert p.returncode == 0, p.stderr
    result = result_of(tmp_path)
    base, dflash = result["runs"]
    assert base["lossless"] is None  # the baseline is what the others are compared with
    same = dflash["lossless"]
    assert same["status"] == "identical" and same["first_divergence"] is None
    assert (same["compared"], same["identical"], same["share_identical"]) == (N + SEQ, N + SEQ, 1.0)
    assert same["mean_agreeing_prefix"] == same["mean_baseline_tokens"] == NEW
    assert result["lossless_failures"] == [] and result["warnings"] == []
    row = next(line for line in p.stdout.splitlines() if line.startswith("DFLASH "))
    assert f"{N + SEQ}/{N + SEQ}" in row.split()
    assert f"lossless: DFLASH vs baseline: {N + SEQ}/{N + SEQ} requests identical, mean agreeing prefix " \
           f"{NEW} of {NEW} tokens" in p.stdout


def expected_divergence(same: dict) -> None:
    """Prompt 3 differs in both phases at token 77: the sequential one is met first."""
    assert same["status"] == "diverged"
    assert (same["compared"], same["identical"]) == (N + SEQ, N + SEQ - 2)
    assert same["mean_agreeing_prefix"] == round(((N + SEQ - 2) * NEW + 2 * DIVERGING_TOKEN) / (N + SEQ), 2)
    base_ids = json.loads((H200 / "baseline.json").read_text())["generate"][DIVERGING_REQUEST]["final"]["output_ids"]
    assert same["first_divergence"] == {
        "phase": "sequential", "request": DIVERGING_REQUEST, "position": DIVERGING_TOKEN,
        "baseline_token": base_ids[DIVERGING_TOKEN], "token": base_ids[DIVERGING_TOKEN] + 1}


def test_synthetic_pair_that_diverges_fails_with_its_own_exit_code(tmp_path):
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", "--json", "result.json",
              recs=h200(tmp_path, diverge=True))
    assert p.returncode == errors.NOT_LOSSLESS, p.stderr
    result = result_of(tmp_path)
    expected_divergence(result["runs"][1]["lossless"])
    assert not result["ok"] and result["failures"] == result["lossless_failures"]
    assert [r["ok"] for r in result["runs"]] == [True, False]
    assert (f"FAILED: DFLASH's greedy outputs differ from the baseline's: DFLASH vs baseline: "
            f"{N + SEQ - 2}/{N + SEQ} requests identical") in p.stdout
    assert f"first difference: sequential request {DIVERGING_REQUEST}, token {DIVERGING_TOKEN}" in p.stdout


def test_real_pair_that_diverges_warns(tmp_path):
    p = smoke(tmp_path, *LOAD, *real_pair_args(), "--runs", "baseline,DFLASH", "--json", "result.json",
              recs=h200(tmp_path, diverge=True, text=True))
    assert p.returncode == 0, p.stderr
    result = result_of(tmp_path)
    assert result["ok"] and result["failures"] == [] and result["settings"]["prompts"] == "text"
    expected_divergence(result["runs"][1]["lossless"])
    assert len(result["warnings"]) == 1 and "--require-lossless makes it fatal" in result["warnings"][0]
    assert "WARNING: DFLASH's greedy outputs differ from the baseline's" in p.stdout


def test_real_pair_that_diverges_fails_with_require_lossless(tmp_path):
    p = smoke(tmp_path, *LOAD, *real_pair_args(), "--runs", "baseline,DFLASH", "--require-lossless",
              "--json", "result.json", recs=h200(tmp_path, diverge=True, text=True))
    assert p.returncode == errors.NOT_LOSSLESS, p.stderr
    result = result_of(tmp_path)
    expected_divergence(result["runs"][1]["lossless"])
    assert result["warnings"] == [] and len(result["lossless_failures"]) == 1


def test_without_a_baseline_the_check_says_it_could_not_run(tmp_path):
    p = smoke(tmp_path, *LOAD, "--runs", "DFLASH", "--json", "result.json", recs=h200(tmp_path, diverge=True))
    assert p.returncode == 0, p.stderr
    same = result_of(tmp_path)["runs"][0]["lossless"]
    assert same["status"] == "not checked" and "no baseline run" in same["reason"]
    assert "lossless: DFLASH not checked -- no baseline run" in p.stdout
    assert "identical" not in p.stdout


def test_require_lossless_without_a_baseline_is_a_usage_error(tmp_path):
    p = smoke(tmp_path, *LOAD, "--runs", "DFLASH", "--require-lossless", recs=h200(tmp_path))
    assert p.returncode == errors.USAGE
    assert "--require-lossless needs a baseline" in p.stderr and "started" not in p.stderr


def test_another_failure_takes_precedence_over_a_divergence(tmp_path):
    """A request that failed outright is the first thing to fix: exit 1, both listed."""
    recs = h200(tmp_path, diverge=True)
    doc = json.loads((recs / "DFLASH.json").read_text())
    for g in doc["generate"]:  # speculation inactive: SGLang leaves the spec_* keys out
        g["final"]["meta_info"] = {k: v for k, v in g["final"]["meta_info"].items() if not k.startswith("spec_")}
    (recs / "DFLASH.json").write_text(json.dumps(doc))
    p = smoke(tmp_path, *LOAD, "--runs", "baseline,DFLASH", "--json", "result.json", recs=recs)
    assert p.returncode == errors.FAILED, p.stderr
    result = result_of(tmp_path)
    assert len(result["lossless_failures"]) == 1 and len(result["failures"]) > 1


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
