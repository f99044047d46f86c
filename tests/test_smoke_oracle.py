"""The default smoke (oracle pair) replayed from what SGLang 0.5.11 answered on an H200.

tests/data/smoke/h200-oracle: the default smoke of 2026-12-01 (docs/gpu/smoke-oracle-h200.json):
baseline, DFLASH with the oracle drafter, DFLASH with the poisoned drafter, and the grammar
server. tests/data/smoke/h200-broken: `--pair broken` on the same machine (a drafter one position
off: every draft rejected). The stand-in SGLang replays them; the real command judges them.
"""

import json
import shutil

from test_smoke import DATA, fake_without_ddtree, smoke

from dflashctl import errors
from dflashctl.smoke import acceptance, oracle, synthetic

ORACLE = DATA / "h200-oracle"
BROKEN = DATA / "h200-broken"
REC = json.loads((ORACLE / "DFLASH.json").read_text())["settings"]
LOAD = ["--requests", str(REC["requests"]), "--sequential-requests", str(REC["sequential_requests"]),
        "--max-new-tokens", str(REC["max_new_tokens"]), "--input-len", str(REC["input_len"]),
        "--seed", str(REC["seed"])]
N, SEQ, NEW = REC["requests"], REC["sequential_requests"], REC["max_new_tokens"]


def copy(tmp_path, src=ORACLE, edit=None):
    out = tmp_path / "recs"
    out.mkdir(exist_ok=True)
    for f in src.glob("*.json"):
        doc = json.loads(f.read_text())
        if edit:
            edit(f.stem, doc)
        (out / f.name).write_text(json.dumps(doc))
    return out


def run(tmp_path, *args, recs=None, fake=None):
    extra = {"fake": fake} if fake else {}
    p = smoke(tmp_path, *LOAD, "--pair", "oracle", "--json", "result.json", "--work-dir", str(tmp_path / "work"),
              *args, recs=recs or copy(tmp_path), **extra)
    return p, (json.loads((tmp_path / "result.json").read_text()) if (tmp_path / "result.json").exists() else None)


def test_h200_default_smoke_replays_to_its_verdict(tmp_path):
    p, result = run(tmp_path, fake=fake_without_ddtree(tmp_path))
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
        band = poisoned["acceptance"]["phases"][phase]
        assert band["ok"] and band["accept_length"] == band["predicted"]  # SGLang did what the rule says
        assert band["min"] == round(band["predicted"] - acceptance.POISONED_TOLERANCE, 4)
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
    """The stand-in SGLang offers DDTREE; it replays DFLASH's answers for it."""
    recs = copy(tmp_path)
    shutil.copy(recs / "DFLASH.json", recs / "DDTREE.json")
    p, result = run(tmp_path, recs=recs)
    assert p.returncode == 0, p.stderr
    assert [r["name"] for r in result["runs"]] == ["baseline", "DFLASH", "DFLASH-poisoned", "DDTREE"]
    args = (tmp_path / "work" / "logs" / "DDTREE.log").read_text().split()
    assert args[args.index("--speculative-draft-model-path") + 1].endswith("/draft")
    assert result["runs"][3]["acceptance"]["ok"]


def test_h200_broken_drafter_fails_with_its_own_exit_code_and_the_figures(tmp_path):
    p = smoke(tmp_path, *LOAD, "--pair", "broken", "--no-grammar", "--json", "result.json", recs=copy(tmp_path, BROKEN),
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


def poisoned_as_oracle(run_name, doc):
    """The poisoned run's answers carry the oracle drafter's counters: it accepted too much."""
    if run_name == "DFLASH-poisoned":
        oracle_doc = json.loads((ORACLE / "DFLASH.json").read_text())
        doc["generate"] = oracle_doc["generate"]


def test_a_poisoned_run_above_its_band_fails_too(tmp_path):
    p, result = run(tmp_path, recs=copy(tmp_path, edit=poisoned_as_oracle), fake=fake_without_ddtree(tmp_path))
    assert p.returncode == errors.DRAFTS_REJECTED, p.stderr
    assert "more drafts accepted than the poisoned drafter gets right" in result["failures"][0]
    assert "did not load the poisoned drafter" in result["failures"][0]


def test_a_divergence_with_accepted_drafts_fails_lossless_at_its_position(tmp_path):
    def diverge(run_name, doc):
        if run_name == "DFLASH":
            doc["generate"][2]["final"]["output_ids"][40] += 1
    p, result = run(tmp_path, recs=copy(tmp_path, edit=diverge), fake=fake_without_ddtree(tmp_path))
    assert p.returncode == errors.NOT_LOSSLESS, p.stderr
    first = result["runs"][1]["lossless"]["first_divergence"]
    assert (first["phase"], first["request"], first["position"]) == ("sequential", 2, 40)


def test_a_baseline_that_leaves_the_rule_fails(tmp_path):
    """Same ids everywhere (lossless), but not the pair's rule: the weights served are not these."""
    def shift(run_name, doc):
        if run_name in ("baseline", "DFLASH", "DFLASH-poisoned"):
            doc["generate"][1]["final"]["output_ids"][100] += 1
    p, result = run(tmp_path, recs=copy(tmp_path, edit=shift), fake=fake_without_ddtree(tmp_path))
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
    shape, prompts = oracle.OracleShape(), [list(range(10, 42))]
    for tokens, predicted in ((256, 16.0), (100, 14.2857)):
        band = acceptance.expectations(shape, ["DFLASH"], prompts, 0, tokens)["DFLASH"]["concurrent"]
        assert (band["predicted"], band["min"], band["max"]) == (predicted, round(predicted - 0.5, 4), None)


def test_tensor_parallel_servers_get_their_gpus_and_the_tp_size(tmp_path):
    """--tp-size 2: every server on GPUs 0 and 1 (the module's gpus list), SGLang's --tp-size 2."""
    p, result = run(tmp_path, "--tp-size", "2", "--runs", "baseline,DFLASH", fake=fake_without_ddtree(tmp_path))
    assert p.returncode == 0, p.stderr
    for r in ("baseline", "DFLASH", "grammar"):
        lines = (tmp_path / "work" / "logs" / f"{r}.log").read_text().splitlines()
        args = lines[0].split("server_args: ")[1].split()
        assert args[args.index("--tp-size") + 1] == "2", r
        assert "[fake sglang %s] CUDA_VISIBLE_DEVICES=0,1" % r in lines
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
