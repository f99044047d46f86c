"""The default smoke (oracle pair) against the stand-in SGLang, which decodes the pair's files.

The stand-in reads the rule from the checkpoints smoke writes (tests/data/smoke/fake_sglang/sglang/
standin_model.py), and tests/smoke/test_standin_sglang.py holds its answers to what SGLang 0.5.11 answered
on an H200 for the same requests: tests/data/smoke/h200-oracle (2026-12-01,
docs/gpu/smoke-oracle-h200.json: baseline, DFLASH with the oracle drafter, DFLASH with the poisoned
drafter, the grammar server) and h200-broken (`--pair broken`: every draft rejected). The figures
below are the H200's, written out; the real command judges them.
"""

import json

import pytest

from oracle_load import GRAMMAR, LOAD, NEW, SEQ, N
from smoke_runner import DATA, fake_without_ddtree, prompts, smoke

from dflashctl import errors
from dflashctl.smoke import acceptance, oracle, synthetic

PROMPTS = prompts(8, 32, 0)


def run(tmp_path, *args, fake=None, faults=None):
    extra = {"fake": fake} if fake else {}
    p = smoke(tmp_path, *LOAD, "--pair", "oracle", "--json", "result.json", "--work-dir", str(tmp_path / "work"),
              *args, grammar=GRAMMAR, faults=faults, **extra)
    return p, (json.loads((tmp_path / "result.json").read_text()) if (tmp_path / "result.json").exists() else None)


def test_the_default_smoke_gives_the_h200s_verdict_and_figures(tmp_path):
    p, result = run(tmp_path, fake=fake_without_ddtree(tmp_path))  # SGLang 0.5.11 as released: no DDTREE
    assert p.returncode == 0, p.stdout + p.stderr
    assert result["ok"] and [r["name"] for r in result["runs"]] == ["baseline", "DFLASH", "DFLASH-poisoned"]
    assert result["oracle"]["content_hash"] == json.loads((DATA.parent.parent.parent / "docs" / "gpu" /
                                                           "smoke-oracle-h200.json").read_text())["oracle"]["content_hash"]
    base, dflash, poisoned = result["runs"]
    for run_ in (dflash, poisoned):
        assert run_["lossless"]["status"] == "identical" and run_["lossless"]["identical"] == N + SEQ
    for phase in ("sequential", "concurrent"):
        assert dflash["phases"][phase]["accept_length"] == 16.0  # 16 verify steps for 256 tokens
        hist = dflash["phases"][phase]["acceptance_histogram"]
        assert hist["exact"] and hist["tokens_per_step"] == {"15": hist["steps"] // 16, "16": hist["steps"] * 15 // 16}
    # the poisoned drafter: what the rule predicts, what the H200 measured, and a band of 1 either side
    bands = {"concurrent": (9.1839, 8.1839, 10.1839), "sequential": (9.4815, 8.4815, 10.4815)}
    for phase, (predicted, lo, hi) in bands.items():
        band = poisoned["acceptance"]["phases"][phase]
        assert (band["predicted"], band["min"], band["max"], band["accept_length"]) == (predicted, lo, hi, predicted)
        assert band["ok"]
    for phase in ("sequential", "concurrent"):
        ph = poisoned["phases"][phase]["acceptance_histogram"]
        assert ph["exact"] and len(ph["tokens_per_step"]) > 8  # partial accepts of many lengths
    assert dflash["phases"]["sequential"]["speedup"] > 2  # the H200 measured 3.86
    assert "acceptance: DFLASH concurrent 16 (rule 16, band >= 15.5)" in p.stdout
    assert result["grammar"]["ok"] and "random-weight" in result["grammar"]["target"]
    assert "target: its own server: the random-weight synthetic target" in p.stdout


def test_servers_start_with_the_oracle_weights_and_the_grammar_server_with_its_own(tmp_path):
    p, _ = run(tmp_path, fake=fake_without_ddtree(tmp_path))
    assert p.returncode == 0, p.stderr
    logs = {r: (tmp_path / "work" / "logs" / f"{r}.log").read_text().splitlines()[0].split("server_args: ")[1].split()
            for r in ("baseline", "DFLASH", "DFLASH-poisoned", "grammar")}
    opt = lambda args, f: args[args.index(f) + 1]  # noqa: E731
    root = next((tmp_path / "work" / "models").glob("oracle-*"))
    assert root.name == f"oracle-{oracle.hash_of_dir(root)[:16]}"
    for r in ("baseline", "DFLASH", "DFLASH-poisoned"):
        args = logs[r]
        assert "--load-format" not in args and "--speculative-draft-load-format" not in args  # real weights
        assert "--skip-tokenizer-init" in args and opt(args, "--grammar-backend") == "none"
        assert opt(args, "--model-path") == str(root / "target")
        assert opt(args, "--max-total-tokens") == "32768"
    assert opt(logs["DFLASH"], "--speculative-draft-model-path") == str(root / "draft")
    assert opt(logs["DFLASH-poisoned"], "--speculative-draft-model-path") == str(root / "draft-poisoned")
    assert opt(logs["DFLASH-poisoned"], "--speculative-algorithm") == "DFLASH"
    g = logs["grammar"]
    assert opt(g, "--load-format") == "dummy" and "--skip-tokenizer-init" not in g and "--disable-cuda-graph" in g
    assert opt(g, "--model-path") == str(tmp_path / "work" / "models" / "target")  # the random target


def test_a_second_run_reuses_the_pair_by_its_hash(tmp_path):
    fake = fake_without_ddtree(tmp_path)
    run(tmp_path, fake=fake)
    p, result = run(tmp_path, fake=fake)
    assert p.returncode == 0 and result["oracle"]["reused"] is True
    assert "reused in" in p.stderr


def test_ddtree_runs_with_the_oracle_drafter_where_sglang_has_it(tmp_path):
    """The stand-in SGLang has the DDTree patch (its tree verify decodes as DFLASH's for a drafter
    that is always right)."""
    p, result = run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert [r["name"] for r in result["runs"]] == ["baseline", "DFLASH", "DFLASH-poisoned", "DDTREE"]
    args = (tmp_path / "work" / "logs" / "DDTREE.log").read_text().split()
    assert args[args.index("--speculative-draft-model-path") + 1].endswith("/draft")
    assert result["runs"][3]["acceptance"]["ok"]


def test_h200_broken_drafter_fails_with_its_own_exit_code_and_the_figures(tmp_path):
    p = smoke(tmp_path, *LOAD, "--pair", "broken", "--no-grammar", "--json", "result.json",
              fake=fake_without_ddtree(tmp_path))
    assert p.returncode == errors.DRAFTS_REJECTED, p.stdout + p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["failures"] == result["acceptance_failures"] and len(result["failures"]) == 1
    line = result["failures"][0]
    assert line.startswith("DFLASH: drafts that should be accepted were rejected: the draft path is broken on this host")
    assert "concurrent accept length 1.0039 (rule predicts 16, band >= 15.5)" in line
    dflash = result["runs"][1]
    assert dflash["lossless"]["status"] == "identical"  # rejected drafts cost speed, not correctness
    assert dflash["phases"]["concurrent"]["acceptance_histogram"]["tokens_per_step"] == {"1": N * (NEW - 1)}
    assert f"FAILED: {line}" in p.stdout


def test_a_poisoned_run_above_its_band_fails_too(tmp_path):
    """The poisoned run's server accepts every draft (not the poisoned drafter, or a verify that
    takes what the target would not produce): its outputs stay right, its accept length is 16."""
    p, result = run(tmp_path, fake=fake_without_ddtree(tmp_path),
                    faults=[{"kind": "accept-all", "server": "draft-poisoned"}])
    assert p.returncode == errors.DRAFTS_REJECTED, p.stderr
    assert "more drafts accepted than the poisoned drafter gets right" in result["failures"][0]
    assert "did not load the poisoned drafter" in result["failures"][0]


@pytest.mark.parametrize("at", [40, 255], ids=["middle", "last token"])
def test_a_divergence_with_accepted_drafts_fails_lossless_at_its_position(tmp_path, at):
    faults = [{"kind": "diverge", "server": "DFLASH", "prompt": PROMPTS[2], "at": at}]
    p, result = run(tmp_path, fake=fake_without_ddtree(tmp_path), faults=faults)
    assert p.returncode == errors.NOT_LOSSLESS, p.stderr
    first = result["runs"][1]["lossless"]["first_divergence"]
    assert (first["phase"], first["request"], first["position"]) == ("sequential", 2, at)
    rule = oracle_rule(PROMPTS[2], NEW)  # the baseline follows the rule; DFLASH is one id off there
    assert (first["baseline_token"], first["token"]) == (rule[at], rule[at] + 1)


def oracle_rule(prompt: list[int], n: int) -> list[int]:
    """x[n] = succ(x[n - 15]) on the ids [10, 1000), written out here (docs/smoke.md)."""
    seq = list(prompt)
    for _ in range(n):
        t = seq[-15]
        seq.append(10 + (t - 10 + 1) % 990 if 10 <= t < 1000 else t)
    return seq[len(prompt):]


def test_a_baseline_that_leaves_the_rule_fails(tmp_path):
    """Same ids everywhere (lossless), but not the pair's rule: the weights served are not these."""
    faults = [{"kind": "diverge", "prompt": PROMPTS[1], "at": 100}]  # every server
    p, result = run(tmp_path, fake=fake_without_ddtree(tmp_path), faults=faults)
    assert p.returncode == errors.FAILED, p.stderr
    assert any("baseline sequential request 1 leaves the oracle's rule at token 100" in f for f in result["failures"])


def test_prompts_shorter_than_the_rule_are_refused_before_starting(tmp_path):
    p = smoke(tmp_path, "--pair", "oracle", "--input-len", "8")
    assert p.returncode == errors.USAGE
    assert "shorter than the oracle's rule looks back (15)" in p.stderr and "started" not in p.stderr


def test_poisoned_run_needs_the_oracle_pair(tmp_path):
    p = smoke(tmp_path, "--runs", "baseline,DFLASH-poisoned")  # smoke() picks --pair random
    assert p.returncode == errors.USAGE and "needs the oracle pair" in p.stderr


def test_the_oracle_band_follows_the_rule_at_other_lengths():
    """At 100 new tokens the oracle can commit only 14.29 per step (7 steps): its band moves with
    the rule, so a correct host does not fail for a shorter request."""
    shape, ps = oracle.OracleShape(), [list(range(10, 42))]
    for tokens, band_ in ((256, (16.0, 15.5, None)), (100, (14.2857, 13.7857, None)), (257, (16.0625, 15.5625, None))):
        band = acceptance.expectations(shape, ["DFLASH"], ps, 0, tokens)["DFLASH"]["concurrent"]
        assert (band["predicted"], band["min"], band["max"]) == band_


def test_the_default_prompts_give_the_rules_bands():
    """The default load's prompts: the poisoned drafter's predicted accept length and band per phase
    (the H200 measured exactly the predictions), the oracle drafter's 16 and its floor 15.5."""
    bands = acceptance.expectations(oracle.OracleShape(), ["DFLASH", "DFLASH-poisoned", "baseline"], PROMPTS, 4, 256)
    assert set(bands) == {"DFLASH", "DFLASH-poisoned"}
    assert bands["DFLASH"] == {"concurrent": {"predicted": 16.0, "min": 15.5, "max": None},
                               "sequential": {"predicted": 16.0, "min": 15.5, "max": None}}
    assert bands["DFLASH-poisoned"] == {"concurrent": {"predicted": 9.1839, "min": 8.1839, "max": 10.1839},
                                        "sequential": {"predicted": 9.4815, "min": 8.4815, "max": 10.4815}}
    assert acceptance.expectations(oracle.OracleShape(), ["DFLASH"], PROMPTS, 0, 256)["DFLASH"].keys() == {"concurrent"}


OPEN = {"predicted": 16.0, "min": 15.5, "max": None}
CLOSED = {"predicted": 9.1839, "min": 8.1839, "max": 10.1839}


@pytest.mark.parametrize("band, got, ok", [
    (OPEN, 15.5, True), (OPEN, 15.4999, False), (OPEN, 16.5, True), (OPEN, None, False),
    (CLOSED, 8.1839, True), (CLOSED, 8.1838, False), (CLOSED, 10.1839, True), (CLOSED, 10.184, False),
])
def test_a_value_just_outside_its_band_fails_and_one_on_its_edge_passes(band, got, ok):
    figures, why = acceptance.judge("DFLASH-poisoned", {"concurrent": {"accept_length": got}}, {"concurrent": band})
    assert figures["ok"] is ok and figures["phases"]["concurrent"]["ok"] is ok
    if ok:
        assert why is None
    elif got is not None and band["max"] is not None and got > band["max"]:
        assert why == ("DFLASH-poisoned: more drafts accepted than the poisoned drafter gets right: "
                       f"concurrent accept length {got:g} (rule predicts 9.1839, band 8.1839-10.1839); the server "
                       "did not load the poisoned drafter, or verify accepted tokens the target would not produce")
    else:
        assert why.startswith("DFLASH-poisoned: drafts that should be accepted were rejected: the draft path "
                              "is broken on this host: concurrent accept length "
                              f"{'none' if got is None else f'{got:g}'} (rule predicts")


def test_no_expectations_judge_nothing():
    assert acceptance.judge("DFLASH", {"concurrent": {"accept_length": 1.0}}, None) == (None, None)
    assert acceptance.judge("DFLASH", {}, {}) == (None, None)


def test_the_histogram_counts_tokens_per_verify_step_from_the_stream():
    from dflashctl.smoke.loadgen import RequestResult
    source = "streamed chunks (one per decode step), checked against meta_info.spec_verify_ct"
    reqs = [RequestResult(2, error="HTTP 500", commits=[1, 5], spec_verify_ct=1), RequestResult(3, commits=None),
            RequestResult(0, commits=[1, 16, 16, 3], spec_verify_ct=3),
            RequestResult(1, commits=[1, 2, 16], spec_verify_ct=2)]
    h = acceptance.histogram(reqs)
    assert h == {"tokens_per_step": {"2": 1, "3": 1, "16": 3}, "steps": 5, "exact": True, "source": source}
    assert list(h["tokens_per_step"]) == ["2", "3", "16"]  # by size, not as met
    # a client that read two verify steps as one chunk, or a first chunk of more than the prefill's token
    assert acceptance.histogram([RequestResult(0, commits=[1, 32], spec_verify_ct=2)]) == {
        "tokens_per_step": {"32": 1}, "steps": 1, "exact": False, "source": source}
    assert acceptance.histogram([RequestResult(0, commits=[2, 16], spec_verify_ct=1)])["exact"] is False
    assert acceptance.histogram([]) == {"tokens_per_step": {}, "steps": 0, "exact": True, "source": source}


def test_expectations_cover_the_speculative_runs_of_the_oracle_pair_only():
    shape, ps = oracle.OracleShape(), [PROMPTS[7], PROMPTS[0]]  # 8.26 and 8.83 tokens per step poisoned
    bands = acceptance.expectations(shape, ["baseline", "DFLASH", "DDTREE", "EAGLE3", "DFLASH-poisoned"], ps, 1, 256)
    assert list(bands) == ["DFLASH", "DDTREE", "DFLASH-poisoned"]
    assert bands["DDTREE"] == bands["DFLASH"] == {"concurrent": {"predicted": 16.0, "min": 15.5, "max": None},
                                                  "sequential": {"predicted": 16.0, "min": 15.5, "max": None}}
    poisoned = bands["DFLASH-poisoned"]
    for phase in ("concurrent", "sequential"):
        p = poisoned[phase]
        assert (p["min"], p["max"]) == (round(p["predicted"] - 1, 4), round(p["predicted"] + 1, 4))
    # the sequential phase sends the first prompt only: its own prediction, not the concurrent one's
    assert poisoned["sequential"]["predicted"] == round(oracle.expected_accept_length(shape, ps[:1], 256, True), 4)
    assert poisoned["concurrent"]["predicted"] == round(oracle.expected_accept_length(shape, ps, 256, True), 4)
    assert poisoned["sequential"]["predicted"] != poisoned["concurrent"]["predicted"]


def test_a_broken_run_names_every_phase_out_of_its_band():
    band = {"predicted": 16.0, "min": 15.5, "max": None}
    figures, why = acceptance.judge("DFLASH", {"concurrent": {"accept_length": 1.0039}, "sequential": {}},
                                    {"concurrent": band, "sequential": band})
    assert figures == {"ok": False, "phases": {
        "concurrent": {**band, "accept_length": 1.0039, "ok": False},
        "sequential": {**band, "accept_length": None, "ok": False}}}
    assert why == ("DFLASH: drafts that should be accepted were rejected: the draft path is broken on this host: "
                   "concurrent accept length 1.0039 (rule predicts 16, band >= 15.5); "
                   "sequential accept length none (rule predicts 16, band >= 15.5)")
    ok, none = acceptance.judge("DFLASH", {"concurrent": {"accept_length": 16.0}}, {"concurrent": band})
    assert ok == {"ok": True, "phases": {"concurrent": {**band, "accept_length": 16.0, "ok": True}}} and none is None


def test_tensor_parallel_servers_get_their_gpus_and_the_tp_size(tmp_path):
    """--tp-size 2: every server on GPUs 0 and 1 (the module's gpus list), SGLang's --tp-size 2."""
    p, result = run(tmp_path, "--tp-size", "2", "--runs", "baseline,DFLASH", fake=fake_without_ddtree(tmp_path))
    assert p.returncode == 0, p.stderr
    for r in ("baseline", "DFLASH", "grammar"):
        lines = (tmp_path / "work" / "logs" / f"{r}.log").read_text().splitlines()
        args = lines[0].split("server_args: ")[1].split()
        assert args[args.index("--tp-size") + 1] == "2", r
        assert [x.split("] ", 1)[1] for x in lines if "] CUDA_VISIBLE_DEVICES=" in x] == ["CUDA_VISIBLE_DEVICES=0,1"], r
    assert result["ok"] and result["runs"][1]["lossless"]["status"] == "identical"


def test_a_tp_size_the_pair_cannot_shard_is_refused_before_any_server_starts(tmp_path):
    p, _ = run(tmp_path, "--tp-size", "3", "--no-grammar", fake=fake_without_ddtree(tmp_path))
    assert p.returncode == errors.USAGE, p.stderr
    assert "--tp-size 3: the synthetic models do not shard over 3 GPUs: 16 attention heads do not divide" in p.stderr
    assert "(target, draft, draft-poisoned)" in p.stderr and "started" not in p.stderr


def test_the_oracle_pair_shards_over_2_4_8_and_16_gpus(tmp_path):
    """SGLang's tensor-parallel layers split heads, KV heads (or replicate them) and the MLP: the
    pair's 16 and 16 (and the random pair's 16 and 8) allow 2, 4, 8, 16, never 3 or 32."""
    pair = oracle.write_pair(tmp_path)
    configs = [json.loads((d / "config.json").read_text()) for d in (pair.target, pair.draft, pair.poisoned)]
    for cfg in configs:
        assert cfg["num_key_value_heads"] == cfg["num_attention_heads"] == 16
        for tp in (1, 2, 4, 8, 16):
            assert synthetic.tp_problems(cfg, tp) == [], tp
        assert synthetic.tp_problems(cfg, 3) == ["16 attention heads do not divide over 3 GPUs",
                                                 "16 KV heads neither divide over 3 GPUs nor replicate onto them",
                                                 "intermediate_size 64 does not divide over 3 GPUs"]
        assert synthetic.tp_problems(cfg, 32) == ["16 attention heads do not divide over 32 GPUs"]  # KV: replicated
    random_target = synthetic.target_config(synthetic.PairShape())
    assert [tp for tp in (2, 4, 8, 16) if not synthetic.tp_problems(random_target, tp)] == [2, 4, 8, 16]
    assert synthetic.tp_problems({**random_target, "num_key_value_heads": 6}, 4) == [
        "6 KV heads neither divide over 4 GPUs nor replicate onto them"]
