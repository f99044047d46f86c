"""`dflashctl smoke` end to end against a stand-in SGLang that decodes from its flags and requests.

The stand-in (tests/data/smoke/fake_sglang) is a real package: smoke finds it with the same
source probe it uses for SGLang, starts it through config -> sglang_args -> server.Server, and the
real streaming client talks HTTP to it. It parses its argv as SGLang 0.5.11 does, decodes the
models its flags name (random weights, or the oracle pair's rule read from the checkpoint) and
answers each request from its own parameters; tests/smoke/test_standin_sglang.py holds its answers to
those SGLang gave on the H200 (tests/data/smoke/h200*). Faults are asked of it by FAKE_SGLANG_FAULTS.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from smoke_runner import DATA, GRAMMAR, LOAD_ARGS, SETTINGS, env_for, fake_without_ddtree, prompts, smoke

from dflashctl import errors


def test_default_smoke_measures_every_run_and_compares_with_baseline(tmp_path):
    p = smoke(tmp_path, "--json", "result.json", "--work-dir", str(tmp_path / "work"))
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] and result["failures"] == []
    assert [r["name"] for r in result["runs"]] == ["baseline", "DFLASH", "DDTREE"]
    n, seq_n, new = SETTINGS["requests"], SETTINGS["sequential_requests"], SETTINGS["max_new_tokens"]
    base = result["runs"][0]
    for run in result["runs"]:
        conc, seq = run["phases"]["concurrent"], run["phases"]["sequential"]
        assert (conc["requests"], seq["requests"]) == (n, seq_n)
        assert conc["output_tokens"] == n * new and seq["output_tokens"] == seq_n * new
        assert conc["ttft_ms_mean"] > 0 and conc["e2e_s_mean"] > 0
        assert run["startup_s"] > 0
    for run in result["runs"][1:]:
        # random drafters are never right: the prefill's token, then one verify step per token
        conc = run["phases"]["concurrent"]
        assert conc["spec_verify_ct"] == 4 * 15
        assert conc["accept_length"] == 1.0667  # 16 tokens / 15 steps
        assert run["server_info"]["avg_spec_accept_length"] == pytest.approx(16 / 15)  # the server's own figure
        for phase in ("sequential", "concurrent"):
            mine, theirs = run["phases"][phase]["output_tok_s"], base["phases"][phase]["output_tok_s"]
            assert run["phases"][phase]["speedup"] == round(mine / theirs, 3)
    assert base["phases"]["concurrent"]["speedup"] is None
    # the table: a row per run, and the plain warning about random weights
    lines = p.stdout.splitlines()
    assert lines[0].startswith("measured on ")  # which host and stack (test_smoke_identity.py)
    assert lines[1].split()[:3] == ["run", "start", "s"]
    assert [line.split()[0] for line in lines[3:6]] == ["baseline", "DFLASH", "DDTREE"]
    assert "not a quality or speed-up figure" in p.stdout
    assert "[smoke] starting" in p.stderr or "ready after" in p.stderr  # progress on stderr


def test_servers_start_like_the_service_with_synthetic_flags(tmp_path):
    p = smoke(tmp_path, "--work-dir", str(tmp_path / "work"), "--runs", "baseline,DFLASH")
    assert p.returncode == 0, p.stderr
    logs = {run: (tmp_path / "work" / "logs" / f"{run}.log").read_text() for run in ("baseline", "DFLASH")}
    argv = {run: text.splitlines()[0].split("server_args: ")[1].split() for run, text in logs.items()}
    for run, args in argv.items():
        # the grammar phase: a tokenizer (no --skip-tokenizer-init), xgrammar, compact JSON
        assert "--skip-tokenizer-init" not in args, run
        for flag in ("--disable-piecewise-cuda-graph", "--constrained-json-disable-any-whitespace"):
            assert flag in args, (run, flag)
        opt = lambda f: args[args.index(f) + 1]  # noqa: E731
        assert opt("--grammar-backend") == "xgrammar"
        assert opt("--load-format") == "dummy" and opt("--attention-backend") == "triton"
        assert opt("--mem-fraction-static") == "0.25"  # two or three servers share the GPU
        assert opt("--cuda-graph-max-bs") == "8"
        assert opt("--max-total-tokens") == "65536"  # side-by-side starts cannot starve each other
        assert opt("--model-path") == str(tmp_path / "work" / "models" / "target")
        assert f"TRITON_CACHE_DIR={tmp_path / 'triton'}" in logs[run]  # one cache for all servers
    d = argv["DFLASH"]
    assert d[d.index("--speculative-algorithm") + 1] == "DFLASH"
    assert d[d.index("--speculative-draft-load-format") + 1] == "dummy"
    assert d[d.index("--speculative-num-draft-tokens") + 1] == "16"
    assert d[d.index("--speculative-draft-model-path") + 1] == str(tmp_path / "work" / "models" / "draft")
    assert "--speculative-algorithm" not in argv["baseline"]
    ports = {a[a.index("--port") + 1] for a in argv.values()}
    assert len(ports) == 2
    draft = json.loads((tmp_path / "work" / "models" / "draft" / "config.json").read_text())
    assert draft["dflash_config"]["block_size"] == 16
    target = tmp_path / "work" / "models" / "target"
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {f.name for f in target.iterdir()}


def test_no_grammar_starts_servers_without_a_tokenizer(tmp_path):
    """--no-grammar: the setup before the grammar phase (token ids in and out, no grammar backend)."""
    p = smoke(tmp_path, "--work-dir", str(tmp_path / "work"), "--runs", "baseline,DFLASH", "--no-grammar",
              "--json", "result.json")
    assert p.returncode == 0, p.stderr
    for run in ("baseline", "DFLASH"):
        args = (tmp_path / "work" / "logs" / f"{run}.log").read_text().splitlines()[0].split()
        assert "--skip-tokenizer-init" in args and "--constrained-json-disable-any-whitespace" not in args
        assert args[args.index("--grammar-backend") + 1] == "none"
    assert not (tmp_path / "work" / "models" / "target" / "tokenizer.json").exists()
    result = json.loads((tmp_path / "result.json").read_text())
    assert "grammar" not in result and result["settings"]["grammar"] is False
    assert "grammar phase" not in p.stdout


def test_num_draft_tokens_sets_block_and_flag(tmp_path):
    p = smoke(tmp_path, "--work-dir", str(tmp_path / "work"), "--runs", "DFLASH", "--num-draft-tokens", "8",
              "--launch", "sequential", "--cuda-graph-bs", "1,8")
    assert p.returncode == 0, p.stderr
    args = (tmp_path / "work" / "logs" / "DFLASH.log").read_text().splitlines()[0].split()
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "8"
    assert args[args.index("--cuda-graph-bs") + 1: args.index("--cuda-graph-bs") + 3] == ["1", "8"]
    assert "--cuda-graph-max-bs" not in args  # SGLang takes the largest of --cuda-graph-bs
    assert args[args.index("--mem-fraction-static") + 1] == "0.5"
    draft = json.loads((tmp_path / "work" / "models" / "draft" / "config.json").read_text())
    assert draft["block_size"] == draft["dflash_config"]["block_size"] == 8


def test_json_to_stdout_moves_table_to_stderr(tmp_path):
    p = smoke(tmp_path, "--json", "-", "--runs", "baseline,DFLASH")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert [r["name"] for r in result["runs"]] == ["baseline", "DFLASH"]
    assert "accept len" in p.stderr


def test_first_start_on_a_host_says_that_kernels_compile_once(tmp_path):
    """No tvm-ffi JIT cache yet: one line says why the start is slow; with a cache, no line."""
    cache = tmp_path / "tvm-ffi"
    cold = smoke(tmp_path, "--runs", "baseline", TVM_FFI_CACHE_DIR=str(cache))
    assert cold.returncode == 0, cold.stderr
    notes = [line for line in cold.stderr.splitlines() if "first start on this host" in line]
    assert len(notes) == 1 and str(cache) in notes[0] and "about a minute" in notes[0]
    (cache / "sgl_kernel_jit_rope").mkdir(parents=True)  # what SGLang's first start leaves behind
    warm = smoke(tmp_path, "--runs", "baseline", TVM_FFI_CACHE_DIR=str(cache))
    assert warm.returncode == 0, warm.stderr
    assert "first start on this host" not in warm.stderr
    prebuilt = smoke(tmp_path, "--runs", "baseline", TVM_FFI_CACHE_DIR=str(tmp_path / "empty"),
                     DFLASH_PREBUILT_KERNELS=str(tmp_path / "prebuilt"))
    assert prebuilt.returncode == 0, prebuilt.stderr
    assert f"prebuilt ones from {tmp_path / 'prebuilt'}" in prebuilt.stderr
    assert "first start on this host" not in prebuilt.stderr


def test_ddtree_is_skipped_when_sglang_lacks_it(tmp_path):
    p = smoke(tmp_path, "--json", "result.json", fake=fake_without_ddtree(tmp_path))
    assert p.returncode == 0, p.stderr
    runs = [r["name"] for r in json.loads((tmp_path / "result.json").read_text())["runs"]]
    assert runs == ["baseline", "DFLASH"]


def test_asking_for_ddtree_without_it_fails_before_starting(tmp_path):
    p = smoke(tmp_path, "--runs", "baseline,DDTREE", fake=fake_without_ddtree(tmp_path))
    assert p.returncode == errors.PREFLIGHT_SGLANG
    assert "does not accept --speculative-algorithm DDTREE" in p.stderr
    assert "started" not in p.stderr


def test_empty_response_fails(tmp_path):
    p = smoke(tmp_path, "--json", "result.json", "--runs", "baseline,DFLASH",
              faults=[{"kind": "empty", "server": "DFLASH", "prompt": prompts()[1]}])
    assert p.returncode == errors.FAILED
    result = json.loads((tmp_path / "result.json").read_text())
    assert not result["ok"]
    assert any("DFLASH" in f and "request 1: empty response" in f for f in result["failures"])
    assert "FAILED: DFLASH" in p.stdout
    assert [r["ok"] for r in result["runs"]] == [True, False]


def test_inactive_speculation_fails(tmp_path):
    # SGLang leaves the spec_* keys out of meta_info when it verified nothing
    p = smoke(tmp_path, "--json", "result.json", "--runs", "baseline,DFLASH",
              faults=[{"kind": "inactive", "server": "DFLASH"}])
    assert p.returncode == errors.FAILED
    result = json.loads((tmp_path / "result.json").read_text())
    assert any("spec_verify_ct is 0 -- DFLASH was not active" in f for f in result["failures"])
    assert result["runs"][0]["ok"]  # the baseline has no speculative counters by design


def test_server_dying_at_start_stops_smoke_with_log_tail(tmp_path):
    p = smoke(tmp_path, FAKE_SGLANG_DIE="start")
    assert p.returncode == errors.SERVER_DIED_BEFORE_READY, p.stderr
    assert "exited with status 1 before it was ready" in p.stderr
    assert "CUDA error: out of memory (replayed failure)" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_failed_smoke_still_writes_its_json_and_replaces_an_old_one(tmp_path):
    (tmp_path / "result.json").write_text('{"ok": true}')  # an earlier run's result
    p = smoke(tmp_path, "--json", "result.json", "--runs", "DFLASH", FAKE_SGLANG_DIE="start")
    assert p.returncode == errors.SERVER_DIED_BEFORE_READY, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] is False and result["runs"] == []
    assert result["error"]["exit_code"] == errors.SERVER_DIED_BEFORE_READY
    assert result["failures"] == [result["error"]["what"]] and "DFLASH server" in result["error"]["what"]
    assert "replayed failure" in result["error"]["why"]  # the log tail travels with it
    p = smoke(tmp_path, "--json", "-", "--runs", "DFLASH", FAKE_SGLANG_DIE="start")
    assert p.returncode == errors.SERVER_DIED_BEFORE_READY
    assert json.loads(p.stdout)["error"]["exit_code"] == errors.SERVER_DIED_BEFORE_READY


def test_server_dying_at_start_while_another_is_measured(tmp_path):
    """Together: the baseline is measured while DFLASH still starts; DFLASH's death ends it all."""
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--max-new-tokens", "16",
              FAKE_SGLANG_DIE="start@DFLASH", FAKE_SGLANG_DIE_AFTER="1.5")
    assert p.returncode == errors.SERVER_DIED_BEFORE_READY, p.stderr
    assert "DFLASH server: SGLang exited with status 1 before it was ready" in p.stderr
    assert "baseline ready after" in p.stderr


def test_wait_all_measures_on_a_quiet_gpu(tmp_path):
    p = smoke(tmp_path, "--json", "result.json", "--runs", "baseline,DFLASH", "--wait-all",
              FAKE_SGLANG_READY_AFTER="0.3")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert [r["measured_while_starting"] for r in result["runs"]] == [[], []]


def test_default_measures_each_server_once_ready(tmp_path):
    p = smoke(tmp_path, "--json", "result.json", "--runs", "baseline,DFLASH",
              FAKE_SGLANG_READY_AFTER="0.2", FAKE_SGLANG_READY_AFTER_DFLASH="4")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert [r["name"] for r in result["runs"]] == ["baseline", "DFLASH"]  # plan order in the report
    assert [r["measured_while_starting"] for r in result["runs"]] == [["DFLASH"], []]
    assert "baseline was measured while DFLASH still started" in p.stdout


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_server_dying_mid_run_stops_smoke_and_its_helpers(tmp_path):
    """The leader exits while a helper keeps the sockets open: only watching the process notices;
    the per-request timeout (300 s) would otherwise hold the run."""
    pidfile = tmp_path / "helper.pid"
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", FAKE_SGLANG_DIE="generate:3",
              FAKE_SGLANG_HELPER_PIDFILE=str(pidfile))
    assert p.returncode == errors.SERVER_DIED_AFTER_READY, p.stderr
    assert "server exited with status 1 while smoke requests ran" in p.stderr
    assert "illegal memory access" in p.stderr
    helper = int(pidfile.read_text())
    for _ in range(50):  # the kill was sent before smoke exited; give the kernel a moment to reap
        if not pid_alive(helper):
            break
        time.sleep(0.1)
    else:
        os.kill(helper, signal.SIGKILL)
        pytest.fail("smoke left the dead server's helper process running")


def test_url_mode_measures_a_running_service_against_a_baseline_url(tmp_path, running):
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    dflash = running("DFLASH", api_key="s3cret")
    base = running("baseline", api_key="s3cret")
    p = smoke(tmp_path, "--url", dflash, "--baseline-url", base, "--api-key-file", str(key),
              "--json", "result.json")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert [(r["name"], r["base_url"]) for r in result["runs"]] == [("baseline", base), ("DFLASH", dflash)]
    assert result["runs"][1]["phases"]["concurrent"]["speedup"] > 0
    assert result["note"] is None  # a service's own models: no random-weights warning


def test_url_mode_without_the_key_says_how_to_pass_it(tmp_path, running):
    url = running("DFLASH", api_key="s3cret")
    p = smoke(tmp_path, "--url", url)
    assert p.returncode == errors.FAILED
    assert "HTTP 401" in p.stderr and "--api-key-file" in p.stderr


def test_url_mode_sends_text_when_the_server_has_a_tokenizer(tmp_path, running):
    url = running("DFLASH", args=())  # no --skip-tokenizer-init
    p = smoke(tmp_path, "--url", url, "--json", "result.json")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["settings"]["prompts"] == "text"
    assert result["runs"][0]["phases"]["concurrent"]["output_tokens"] == \
        SETTINGS["requests"] * SETTINGS["max_new_tokens"]


def test_record_writes_what_the_h200_recordings_hold(tmp_path):
    """--record keeps each run's requests and answers in the format of tests/data/smoke/h200-grammar
    (what a GPU run writes): the stand-in's answers have the keys SGLang 0.5.11's had there."""
    p = smoke(tmp_path, "--record", "rec", "--json", "first.json")
    assert p.returncode == 0, p.stderr
    rec = tmp_path / "rec"
    assert sorted(f.name for f in rec.iterdir()) == ["DDTREE.json", "DFLASH.json", "baseline.json"]
    for run in ("baseline", "DFLASH"):
        mine = json.loads((rec / f"{run}.json").read_text())
        h200 = json.loads((DATA / "h200-grammar" / f"{run}.json").read_text())
        assert set(mine) == set(h200)
        # the stand-in has the DDTree patch, which adds one field
        assert set(mine["server_info"]) - {"speculative_ddtree_budget"} == set(h200["server_info"])
        assert len(mine["generate"]) == SETTINGS["requests"]
        for g in mine["generate"]:
            assert set(g) == set(h200["generate"][0]) and set(g["final"]) == set(h200["generate"][0]["final"])
            assert set(g["final"]["meta_info"]) == set(h200["generate"][0]["final"]["meta_info"])
            assert g["chunk_tokens"] == list(range(1, 17))  # a chunk per decode step (random drafts: 1 token)
        assert [(r["kind"], r["status"]) for r in mine["grammar"]] == [(r["kind"], r["status"]) for r in h200["grammar"]]


@pytest.mark.parametrize("args, message", [
    (["--url", "http://x", "--model", "m"], "cannot be combined"),
    (["--model", "m"], "go together"),
    (["--baseline-url", "http://x"], "needs --url"),
    (["--runs", "baseline,medusa"], "unknown run"),
])
def test_bad_arguments_are_usage_errors(tmp_path, args, message):
    p = smoke(tmp_path, *args)
    assert p.returncode == errors.USAGE
    assert message in p.stderr


def test_sigterm_while_servers_start_stops_them(tmp_path):
    """`timeout` or systemd ending smoke must not leave SGLang servers holding the GPU."""
    cmd = [sys.executable, "-m", "dflashctl", "smoke", *LOAD_ARGS, "--triton-cache", "none", "--pair", "random"]
    proc = subprocess.Popen(cmd, env=env_for(FAKE_SGLANG_READY_AFTER="600"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    pids = []
    for line in proc.stderr:
        if "started " in line:
            pids.append(int(line.split("(pid ")[1].split(",")[0]))
        if len(pids) == 3:
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if pid_alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "servers outlived smoke"
    assert proc.returncode == 128 + signal.SIGTERM


def test_work_dir_is_removed_after_a_pass_and_kept_after_a_failure(tmp_path):
    """Without --work-dir smoke works in a temporary directory (models, logs): gone when it passed,
    kept and named when it failed."""
    (tmp_path / "tmp").mkdir()
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", TMPDIR=str(tmp_path / "tmp"))
    assert p.returncode == 0, p.stderr
    assert list((tmp_path / "tmp").iterdir()) == [] and "for a look" not in p.stderr

    p = smoke(tmp_path, "--runs", "baseline,DFLASH", TMPDIR=str(tmp_path / "tmp"),
              faults=[{"kind": "diverge", "server": "DFLASH", "prompt": prompts()[0], "at": 3}])
    assert p.returncode == errors.NOT_LOSSLESS, p.stderr
    kept = list((tmp_path / "tmp").glob("dflash-smoke-*"))
    assert len(kept) == 1 and f"kept {kept[0]}" in p.stderr


H200_LOAD = ["--requests", "8", "--sequential-requests", "4", "--max-new-tokens", "256", "--input-len", "32",
             "--seed", "0"]  # the default load, as on the H200 (tests/data/smoke/h200*/*.json "settings")


def test_the_default_load_gives_the_acceptance_sglang_gave_for_random_weights(tmp_path):
    """SGLang 0.5.11 on the H200 (tests/data/smoke/h200, 2026-11-30): 255 verify steps for each
    request's 256 tokens, accept length 1.0039; the stand-in's random drafter is never right either."""
    p = smoke(tmp_path, *H200_LOAD, "--runs", "baseline,DFLASH", "--json", "result.json", "--no-grammar")
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] and [r["name"] for r in result["runs"]] == ["baseline", "DFLASH"]
    conc = result["runs"][1]["phases"]["concurrent"]
    assert (conc["requests"], conc["output_tokens"], conc["spec_verify_ct"]) == (8, 8 * 256, 8 * 255)
    assert conc["accept_length"] == 1.0039


def test_the_default_smoke_with_grammar_passes_with_the_h200s_grammar_answers(tmp_path):
    """The default smoke (grammar phase on) with the constrained answers SGLang 0.5.11 gave on an
    H200 (`--record`, 2026-11-30, docs/gpu/smoke-final-h200.json): it passes as it did there,
    including the tool call that SGLang returned as content because no tool-call parser was set."""
    tool = [g for g in json.loads(GRAMMAR.read_text())["grammar"] if g["kind"] == "tool_call"][0]
    message = tool["response"]["choices"][0]["message"]
    assert message["tool_calls"] is None and message["content"].startswith('[{"name": "get_weather"')
    p = smoke(tmp_path, *H200_LOAD, "--runs", "baseline,DFLASH", "--json", "result.json",
              "--work-dir", str(tmp_path / "work"))
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] and result["failures"] == []
    assert result["runs"][1]["lossless"]["status"] == "identical"
    servers = {s["run"]: s for s in result["grammar"]["servers"]}
    rows = servers["baseline"]["rows"]
    assert [(r["kind"], r["status"]) for r in rows] == [
        ("regex", "ok"), ("ebnf", "ok"), ("json_schema", "ok"), ("structural_tag", "ok"),
        ("json_schema", "ok"), ("tool_call", "ok")]
    assert rows[-1]["output"] == 'get_weather({"city": "Berlin"})'
    assert [(r["status"], r["http_status"]) for r in servers["DFLASH"]["rows"]] == [("refused", 400)]
    assert "6/6 outputs match their grammars" in p.stdout


def smoke_sending(tmp_path, change: str, *args, **extra):
    """smoke with its request bodies changed by `change` (Python over `body`, a dict): a load
    generator that lost one of its parameters, against the same stand-in."""
    code = ("import sys\n"
            "from dflashctl.smoke import loadgen\n"
            "payload = loadgen.payload\n"
            "def changed(prompt, n, *more, **named):\n"
            "    body = payload(prompt, n, *more, **named)\n"
            f"    {change}\n"
            "    return body\n"
            "loadgen.payload = changed\n"
            "from dflashctl.cli import main\n"
            "raise SystemExit(main(sys.argv[1:]))\n")
    extra.setdefault("TVM_FFI_CACHE_DIR", str(tmp_path / "tvm-ffi"))
    cmd = [sys.executable, "-c", code, "smoke", *LOAD_ARGS, "--triton-cache", str(tmp_path / "triton"),
           "--pair", "random", "--runs", "baseline,DFLASH", "--no-grammar", "--json", "result.json", *args]
    return subprocess.run(cmd, env=env_for(**extra), capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_a_smoke_that_samples_fails_the_lossless_check(tmp_path):
    """Without temperature 0 SGLang samples (its default temperature is 1.0): two servers, or two
    calls, give other tokens, and smoke must say its outputs are not plain decoding's."""
    p = smoke_sending(tmp_path, 'del body["sampling_params"]["temperature"]')
    assert p.returncode == errors.NOT_LOSSLESS, p.stdout + p.stderr
    lossless = json.loads((tmp_path / "result.json").read_text())["runs"][1]["lossless"]
    assert lossless["status"] == "diverged" and lossless["identical"] < lossless["compared"]


def test_a_smoke_without_ignore_eos_gets_answers_cut_at_the_eos(tmp_path):
    """The random target's EOS comes up now and then: without ignore_eos requests end early, so
    each run no longer decodes the same number of tokens and the figures are not comparable."""
    p = smoke_sending(tmp_path, 'del body["sampling_params"]["ignore_eos"]', *H200_LOAD)
    result = json.loads((tmp_path / "result.json").read_text())
    assert p.returncode == errors.FAILED, p.stdout + p.stderr
    tokens = result["runs"][0]["phases"]["concurrent"]["output_tokens"]
    assert tokens < 8 * 256
    assert any("tokens, not the 256 asked (finish reason stop)" in f for f in result["failures"]), result["failures"]


def test_a_smoke_that_does_not_stream_fails(tmp_path):
    """Without "stream": true SGLang answers with one JSON object, no event stream (the sweep's
    form): each request is one chunk, with no time to first token and no verify steps to count, so
    the smoke's streamed phases refuse it."""
    p = smoke_sending(tmp_path, 'body["stream"] = False')
    result = json.loads((tmp_path / "result.json").read_text())
    assert p.returncode == errors.FAILED, p.stdout + p.stderr
    for run in result["runs"]:
        phase = run["phases"]["concurrent"]
        assert phase["ttft_ms_mean"] is None and "acceptance_histogram" not in phase, p.stderr
        assert [(q["chunks"], q["ttft_s"], q["output_tokens"]) for q in run["requests"]["concurrent"]] == [
            (1, None, 16)] * 4
    assert any("concurrent request 0: answered in one piece, not as a stream" in f
               for f in result["failures"]), result["failures"]


def test_a_smoke_asking_fewer_tokens_is_answered_with_fewer(tmp_path):
    p = smoke_sending(tmp_path, 'body["sampling_params"]["max_new_tokens"] = 5')
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["runs"][0]["phases"]["concurrent"]["output_tokens"] == 4 * 5, p.stderr
