"""The concurrency sweep (`smoke --sweep`): its plan, its JSON and its verdict.

End to end against the stand-in SGLang decoding the oracle pair from its files (as SGLang 0.5.11
would, whatever the load): the throughput figures here are the stand-in's, so only the plan, the
checks and the summary are under test. Where a speculative run falls below the baseline is a pure function of the figures
(sweep.crossing), checked on figures given here.
"""

import importlib.util
import json

import pytest
from oracle_load import GRAMMAR, LOAD, NEW, SEQ, N
from smoke_runner import DATA, fake_without_ddtree, smoke

from dflashctl import errors
from dflashctl.smoke import oracle, sweep

PLOT = DATA.parent.parent.parent / "benchmarks" / "sweep_plot.py"


def run(tmp_path, *args, fake, faults=None):
    """The real command, oracle pair, against the stand-in (`faults`: what it is to break)."""
    p = smoke(tmp_path, *LOAD, "--pair", "oracle", "--json", "result.json", "--work-dir", str(tmp_path / "work"),
              *args, grammar=GRAMMAR, faults=faults, fake=fake, timeout=180)
    out = tmp_path / "result.json"
    return p, (json.loads(out.read_text()) if out.exists() else None)


def server_args(tmp_path, name: str) -> list[str]:
    return (tmp_path / "work" / "logs" / f"{name}.log").read_text().splitlines()[0].split("server_args: ")[1].split()


def opt(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The default oracle-pair smoke with --sweep 1,4,16 (grammar off: it has no sweep)."""
    tmp = tmp_path_factory.mktemp("sweep")
    p, result = run(tmp, "--sweep", "1,4,16", "--no-grammar", fake=fake_without_ddtree(tmp))
    return tmp, p, result


def test_each_point_is_a_phase_of_every_run_with_the_same_prompt_mix(swept):
    tmp, p, result = swept
    assert p.returncode == 0, p.stdout + p.stderr
    s = result["sweep"]
    assert s["points"] == [1, 4, 16] and s["rounds"] == 2
    assert s["requests"] == {"1": N, "4": N, "16": 32}  # whole passes over the 8 prompts, >= 2 rounds of C
    assert [r["name"] for r in s["runs"]] == ["baseline", "DFLASH", "DFLASH-poisoned"]
    for r in result["runs"]:
        for c, n in ((1, 8), (4, 8), (16, 32)):
            phase = r["phases"][sweep.phase_name(c)]
            assert phase["requests"] == n and phase["failed"] == 0 and phase["concurrency"] == c
            assert phase["output_tokens"] == n * NEW
            answers = r["requests"][sweep.phase_name(c)]
            assert all(q["chunks"] == 1 and q["ttft_s"] is None for q in answers)  # not streamed
            assert "acceptance_histogram" not in phase  # only a stream shows each verify step
    base, dflash, poisoned = result["runs"]
    assert dflash["lossless"]["status"] == "identical" and dflash["lossless"]["compared"] == N + SEQ + 8 + 8 + 32
    assert poisoned["lossless"]["identical"] == N + SEQ + 48
    # the same prompt mix at every point: the poisoned drafter's prediction is the concurrent phase's
    bands = poisoned["acceptance"]["phases"]
    for c in (1, 4, 16):
        band = bands[sweep.phase_name(c)]
        assert band["ok"] and band["predicted"] == bands["concurrent"]["predicted"] == band["accept_length"]
        assert dflash["acceptance"]["phases"][sweep.phase_name(c)]["accept_length"] == 16.0
    for entry in s["runs"][1:]:
        assert [pt["concurrency"] for pt in entry["points"]] == [1, 4, 16]
        assert all(pt["speedup"] is not None for pt in entry["points"])
        assert entry["server_limits"] == []  # every point ran at once, in a CUDA graph
        assert entry["line"].startswith(entry["name"] + ": ")
    assert "concurrency sweep: output tok/s (x baseline)" in p.stdout and "C=16" in p.stdout


def test_the_timed_servers_capture_each_point_and_run_it_at_once(swept):
    tmp, p, result = swept
    for name in ("baseline", "DFLASH", "DFLASH-poisoned"):
        args = server_args(tmp, name)
        assert opt(args, "--max-running-requests") == "16"  # DFLASH would cap itself at 48 otherwise
        i = args.index("--cuda-graph-bs")
        assert args[i + 1:i + 5] == ["1", "4", "8", "16"] and args[i + 5].startswith("--")  # points and --requests 8
        assert "--cuda-graph-max-bs" not in args
        assert opt(args, "--max-total-tokens") == "32768"  # 16 x (32 + 256 + 32) tokens fit the default cap
    assert result["settings"]["sweep"] == [1, 4, 16] and result["settings"]["sweep_rounds"] == 2


def test_a_point_larger_than_the_pool_raises_it_and_own_graph_flags_stay(tmp_path):
    p, result = run(tmp_path, "--runs", "baseline", "--no-grammar", "--sweep", "128", "--sweep-rounds", "1",
                    "--cuda-graph-bs", "1,8", fake=fake_without_ddtree(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    args = server_args(tmp_path, "baseline")
    assert opt(args, "--max-total-tokens") == str(128 * (32 + NEW + 2 * 16))  # 40960, a multiple of 4096
    assert opt(args, "--max-running-requests") == "128"
    assert args.count("--cuda-graph-bs") == 1 and args[args.index("--cuda-graph-bs") + 1:][:2] == ["1", "8"]
    base = result["sweep"]["runs"][0]
    assert base["points"][0]["requests"] == 128
    assert base["server_limits"] == ["CUDA graphs go up to batch 8: points 128 decode without them"]
    assert "note: baseline: CUDA graphs go up to batch 8" in p.stdout


def test_a_difference_only_under_the_sweeps_load_fails_lossless_at_that_point(tmp_path):
    # DFLASH's server answers 21 requests before the sweep (warm-up 1 + 8, sequential 4, concurrent
    # 8), then 1 + 8 at C=1 and 4 + 8 at C=4 (warm-up, measured) and 16 warm-up requests at C=16:
    # from there on it answers one token wrong.
    p, result = run(tmp_path, "--runs", "baseline,DFLASH", "--no-grammar", "--sweep", "1,4,16",
                    fake=fake_without_ddtree(tmp_path),
                    faults=[{"kind": "diverge", "server": "DFLASH", "at": -1, "after": 21 + 9 + 12 + 16}])
    assert p.returncode == errors.NOT_LOSSLESS, p.stdout + p.stderr
    dflash = result["runs"][1]
    d = dflash["lossless"]["first_divergence"]
    assert d["phase"] == "sweep 16" and d["position"] == NEW - 1
    assert dflash["lossless"]["identical"] == N + SEQ + 16  # every request before that point
    assert result["failures"] == result["lossless_failures"] and len(result["failures"]) == 1
    assert "sweep 16 request 0, token 255" in result["failures"][0]


def test_the_baseline_is_held_to_the_rule_at_every_point(tmp_path):
    # 21 requests before the sweep and 16 warm-up requests, then every answer one token wrong
    p, result = run(tmp_path, "--runs", "baseline", "--no-grammar", "--sweep", "16", "--sweep-rounds", "1",
                    fake=fake_without_ddtree(tmp_path),
                    faults=[{"kind": "diverge", "server": "baseline", "at": -1, "after": 37}])
    assert p.returncode == errors.FAILED, p.stdout + p.stderr
    [line] = result["failures"]
    assert line.startswith("baseline sweep 16 request 0 leaves the oracle's rule at token 255")


@pytest.mark.parametrize("flags, why", [(["--sweep", "0,4"], "--sweep '0,4' is not a list of concurrencies"),
                                        (["--sweep", "4,x"], "--sweep '4,x' is not a list of concurrencies"),
                                        (["--sweep", "4", "--sweep-rounds", "0"], "--sweep-rounds: 0 must be 1 or more")])
def test_bad_sweep_arguments_are_refused_before_anything_starts(tmp_path, flags, why):
    p, _ = run(tmp_path, *flags, fake=fake_without_ddtree(tmp_path))
    assert p.returncode == errors.USAGE and why in p.stderr, p.stderr
    assert "started" not in p.stderr


def points(*pairs):
    return [{"concurrency": c, "speedup": s} for c, s in pairs]


def test_where_a_run_falls_below_the_baseline():
    # stays below from 8 on; break-even between 4 (1.2x) and 8 (0.9x), in log2 of the concurrency
    assert sweep.crossing(points((1, 3.0), (2, 2.0), (4, 1.2), (8, 0.9), (16, 0.7))) == (8, 6.3)
    assert sweep.crossing(points((1, 0.9), (2, 1.1), (4, 1.05))) == (None, None)  # a dip, then above again
    assert sweep.crossing(points((1, 1.5), (2, 0.8), (4, 1.1), (8, 0.95))) == (8, 6.3)  # the last crossing counts
    assert sweep.crossing(points((1, 0.9), (2, 0.5))) == (1, None)  # below at every point
    assert sweep.crossing(points((1, 2.0), (4, 1.0), (8, None))) == (None, None)  # 1.0 is not below
    assert sweep.crossing([]) == (None, None)


def test_the_summary_names_points_a_server_did_not_run_as_asked():
    result = {"settings": {"sweep": [8, 64], "sweep_rounds": 1, "requests": 8, "max_new_tokens": 256}, "runs": [
        {"name": "DFLASH", "algorithm": "DFLASH",
         "server_info": {"max_running_requests": 48, "cuda_graph_bs": [1, 2, 4, 8], "disable_cuda_graph": False},
         "phases": {sweep.phase_name(c): {"requests": c, "failed": 0, "output_tok_s": 100.0 * c, "speedup": s,
                                          "accept_length": 9.2, "e2e_s_mean": 0.1, "e2e_s_max": 0.2}
                    for c, s in ((8, 1.4), (64, 0.8))}}]}
    [entry] = sweep.summary(result)["runs"]
    assert entry["server_limits"] == [
        "the server runs at most 48 requests at once (max_running_requests): points 64 queue the rest",
        "CUDA graphs go up to batch 8: points 64 decode without them"]
    assert entry["falls_below_baseline_at"] == 64 and entry["below_baseline_at"] == [64]
    assert entry["line"] == ("DFLASH: falls below the baseline at 64 concurrent requests and stays below, "
                             "break-even near 32 (1.40x at 8, 0.80x at 64)")  # 2 ** (3 + 0.4 / 0.6 * 3)
    assert sweep.summary({"settings": {}, "runs": []}) is None


def test_the_sweeps_prompt_order_repeats_the_smokes_prompts():
    prompts = [[10 + i] * 15 for i in range(8)]
    order = sweep.prompt_order(16, prompts, 2)
    assert len(order) == 32 and order[:8] == prompts and order[8:16] == prompts
    rule = {i: oracle.greedy(oracle.OracleShape(), p, 16) for i, p in enumerate(order)}
    assert rule[9] == rule[1]  # request 9 is prompt 1


def load_plot():
    spec = importlib.util.spec_from_file_location("sweep_plot", PLOT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plot_script_reads_its_series_from_the_smokes_json(swept, tmp_path):
    tmp, p, result = swept
    plot = load_plot()
    series = plot.series(result)
    assert [s["name"] for s in series["runs"]] == ["baseline", "DFLASH", "DFLASH-poisoned"]
    assert series["runs"][1]["concurrency"] == [1, 4, 16]
    assert series["runs"][1]["speedup"] == [pt["speedup"] for pt in result["sweep"]["runs"][1]["points"]]
    assert series["runs"][0]["speedup"] is None  # the baseline is the line at 1
    with pytest.raises(SystemExit, match="no concurrency sweep"):
        plot.series({"runs": []})
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed: the PNG itself is not drawn here (the series above are)")
    (tmp_path / "r.json").write_text(json.dumps(result))
    out = tmp_path / "sweep.png"
    assert plot.main([str(tmp_path / "r.json"), "--out", str(out), "--title", "stand-in"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
