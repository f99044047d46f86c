"""`dflashctl status` where parts of a host are missing, its JSON held to docs/status.schema.json,
`--watch` on a terminal and off it, and the Prometheus text reader over the H200 recordings.

The full host (the real router, stand-ins, a stopped worker) is tests/operations/test_monitoring.py's; the
unit state and journal under a real systemd are tests/service/test_systemd.py's.
"""

import json
import re
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from dflashctl.operations.metrics_text import Metrics, ParseError, parse
from dflashctl.smoke import schema
from nvml_scenario import Scenario, build_fake_nvml
from rollout_harness import QUICK_CANARY, Supervisor, serve_argv
from router_harness import ENV, STANDIN, Router, free_port, listening, needs_router, request

RECORDED = REPO / "tests" / "data" / "metrics" / "h200"
SCHEMA = json.loads((REPO / "docs" / "status.schema.json").read_text())


def test_the_recorded_instance_metrics_read_as_sglang_wrote_them():
    m = Metrics.from_text((RECORDED / "instance-metrics.txt").read_text())
    assert m.maximum("sglang:spec_accept_length") == 15.75
    assert m.total("sglang:generation_tokens_total") == 1544.0 and m.total("sglang:num_requests_total") == 25.0
    assert m.total("sglang:time_to_first_token_seconds_count") == 25.0
    inf = m.select("sglang:time_to_first_token_seconds_bucket", le="+Inf")
    assert len(inf) == 1 and inf[0].value == 25.0 and inf[0].label("engine_type") == "unified"
    assert m.total("sglang:inter_token_latency_seconds_bucket") is None  # no streamed request was recorded


def test_the_recorded_router_metrics_read_as_sglang_router_wrote_them():
    m = Metrics.from_text((RECORDED / "router-metrics.txt").read_text())
    assert m.total("smg_worker_health", worker="http://127.0.0.1:31000") == 1
    assert m.total("smg_router_requests_total") == 24 and m.total("smg_worker_retries_total") is None


def test_the_text_format_edges():
    s = parse('# HELP x y\nx{a="q\\"uo\\\\te",b="n\\nl"} 1.5 1700000000\ny +Inf\nz{} NaN\n')
    assert [(x.name, dict(x.labels)) for x in s] == [("x", {"a": 'q"uo\\te', "b": "n\nl"}), ("y", {}), ("z", {})]
    assert s[0].value == 1.5 and s[1].value == float("inf")
    for bad in ('x{a="unterminated} 1', "x", 'x{a=1} 2', "x one"):
        with pytest.raises(ParseError):
            parse(bad)


def test_the_journal_line_that_reads_as_an_error():
    from dflashctl.operations.status_collect import reads_as_error
    assert reads_as_error("ImportError: cannot import name 'StructuralTag' from 'xgrammar'")
    assert reads_as_error("[2026-12-01 10:00:00] CUDA error: an illegal memory access was encountered")
    assert reads_as_error("dflashctl serve: GPU 0 (NVIDIA H200) failed while serving: XID 79; stopping SGLang")
    assert reads_as_error("anything at all", priority="3")
    assert not reads_as_error("dflashctl serve: ready after 41.0 s: http://127.0.0.1:30000/health_generate decoded")
    assert not reads_as_error("dflashctl serve: GPU watch: off: OSError: libnvidia-ml.so.1: cannot open shared object")
    assert not reads_as_error("dflashctl serve: preflight warning: cuda-home: nvcc failed to run")


def status(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflashctl", "status", *args], capture_output=True, text=True,
                          env=dict(ENV, **(env or {})), timeout=timeout)


def settings(tmp_path: Path, name: str, **extra) -> Path:
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps({"name": name, "model": "m", "port": free_port(55535), **extra}))
    return f


def test_a_host_with_nothing_running_names_every_missing_part(tmp_path):
    """No systemd here, no driver, no router settings, nothing listening: every row still comes,
    each gap named, and the verdict is unhealthy (nothing answers)."""
    files = [settings(tmp_path, "a", draftModel="d", speculative={"algorithm": "DFLASH"}),
             settings(tmp_path, "off", enableMetrics=False)]
    done = status("--json", "--window", "0", "--router", str(tmp_path / "no-router.json"), "--no-systemd",
                  *[x for f in files for x in ("--instance", str(f))])
    assert done.returncode == 78 and "no-router.json" in done.stderr  # a router file named but absent
    done = status("--json", "--window", "0", "--no-router", *[x for f in files for x in ("--instance", str(f))])
    assert done.returncode == 1, done.stderr
    rep = json.loads(done.stdout)
    assert schema.problems(rep, SCHEMA) == []
    assert [r["name"] for r in rep["instances"]] == ["a", "off"]
    a, off = rep["instances"]
    assert a["answers"] is False and a["problems"] == [f"does not answer at {a['url']}"]
    assert a["accept_length_min"] == 4.0 and a["accept_length"] is None and a["unit_state"] is None
    assert any("enableMetrics is false" in m for m in off["missing"]) and off["accept_length_min"] is None
    assert rep["router"] is None and rep["router_missing"] == "--no-router"
    assert rep["systemd"] is False and rep["systemd_missing"]
    assert rep["exit_code"] == 1 and rep["problems"] == [f"a: does not answer at {a['url']}",
                                                         f"off: does not answer at {off['url']}"]


def test_no_instances_is_a_settings_error(tmp_path):
    done = status("--instance", str(tmp_path / "missing.json"))
    assert done.returncode == 78 and "missing.json" in done.stderr


def start_standin(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port(55535)
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port), "--host", "127.0.0.1",
                             "--model-path", "m", "--enable-metrics", *extra], env=dict(ENV, STANDIN_READY_AFTER="0"),
                            stdout=open(tmp_path / f"standin-{port}.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while request(f"http://127.0.0.1:{port}/health", timeout=2)[0] != 200:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc, port


@pytest.fixture
def standin(tmp_path):
    proc, port = start_standin(tmp_path)
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"name": "a", "model": "m", "port": port}))
    yield f
    proc.kill()
    proc.wait()


def test_watch_off_a_terminal_prints_one_report_after_another(standin):
    done = status("--watch", "0.3", "--count", "3", "--json", "--no-router", "--instance", str(standin))
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(reports) == 3 and all(schema.problems(r, SCHEMA) == [] for r in reports)
    assert [r["instances"][0]["answers"] for r in reports] == [True] * 3
    assert reports[0]["window_s"] == 0 and reports[2]["window_s"] > 0  # rates over what was seen so far
    text = status("--watch", "0.2", "--count", "2", "--no-router", "--instance", str(standin))
    assert text.returncode == 0 and text.stdout.count("== ") == 2 and "\x1b[" not in text.stdout


def test_watch_on_a_terminal_redraws_in_place_and_gives_the_terminal_back(standin):
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "status", "--watch", "0.3", "--count", "2",
                             "--no-router", "--instance", str(standin)], env=ENV, stdout=follower,
                            stderr=subprocess.PIPE)
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    os.close(leader)
    text = out.decode(errors="replace")
    assert text.startswith("\x1b[?1049h\x1b[?25l")  # the alternate screen, cursor hidden
    assert text.count("\x1b[H\x1b[2J") == 2 and "Ctrl-C to quit" in text
    assert text.endswith("\x1b[?25h\x1b[?1049l")  # and the terminal as it was
    assert "\x1b[32m" in text  # the healthy row in green


def test_gpu_health_is_judged_as_doctor_and_preflight_judge_it(standin, tmp_path):
    """The stand-in libnvidia-ml (tests/nvml_scenario.py: the H200's recorded figures) behind one
    instance on GPUs 0 and 1: healthy, both rows ok and the exit 0; GPU 1 with a row remap pending,
    its cell FAULT and the instance unhealthy with assess's finding and fix; GPU 1 lost, named lost."""
    nvml = build_fake_nvml(tmp_path / "nvml")
    settings_file = tmp_path / "two.json"
    settings_file.write_text(json.dumps(dict(json.loads(standin.read_text()), gpus=[0, 1])))
    args = ("--json", "--window", "0", "--no-router", "--no-systemd", "--instance", str(settings_file))

    def run(s: Scenario) -> tuple[int, dict]:
        done = status(*args, env={"LD_LIBRARY_PATH": str(nvml), "FAKE_NVML_SCENARIO": str(s.path)})
        rep = json.loads(done.stdout)
        assert schema.problems(rep, SCHEMA) == [] and rep["nvml_missing"] is None, (done.stderr, rep)
        return done.returncode, rep

    code, rep = run(Scenario(tmp_path / "healthy.nvml", gpus=2))
    [row] = rep["instances"]
    assert code == 0 and [(g["index"], g["name"], g["health"]) for g in row["gpus"]] == \
        [(0, "NVIDIA H200", "ok"), (1, "NVIDIA H200", "ok")]
    assert row["gpus"][0]["memory_total_mib"] == 143771 and "no row remap pending" in row["gpus"][0]["health_detail"]

    code, rep = run(Scenario(tmp_path / "remap.nvml", gpus=2).set("1.remapped_rows.pending", 1))
    [row] = rep["instances"]
    assert code == 1 and [g["health"] for g in row["gpus"]] == ["ok", "fault"]
    [problem] = row["problems"]
    assert problem.startswith("GPU 1: GPU 1 (NVIDIA H200") and "a row remap is pending" in problem
    assert "fix: with nothing running on it, `nvidia-smi -r -i 1`" in problem

    code, rep = run(Scenario(tmp_path / "lost.nvml", gpus=2).set("1.lost", 1))
    [row] = rep["instances"]
    assert code == 1 and row["gpus"][1]["health"] == "fault" and row["gpus"][1]["memory_total_mib"] is None
    assert "NVML has lost this GPU" in row["problems"][0]
    text = status(*args[1:], env={"LD_LIBRARY_PATH": str(nvml), "FAKE_NVML_SCENARIO": str(tmp_path / "lost.nvml")})
    assert text.returncode == 1 and "1: ? FAULT" in text.stdout and "NVML has lost" in text.stdout


# ------------------------------------------------------------- what status must not call a failure

def test_an_api_key_this_user_cannot_read_is_named_not_failed(tmp_path):
    """SGLang 0.5.11 with --api-key answers 401 on /model_info and /v1/loads without the key, and
    /metrics without one (its auth middleware): an instance whose key file this user cannot read
    answers, its metrics are read, the key is named under `missing`, exit 0. A key it was given and
    refuses, or a key its settings do not name, is a problem."""
    proc, port = start_standin(tmp_path, "--api-key", "s3cret")
    try:
        def run(as_user: bool = False, **extra) -> tuple[int, dict]:
            f = tmp_path / "k.json"
            f.write_text(json.dumps({"name": "k", "model": "m", "port": port, **extra}))
            argv = [sys.executable, "-m", "dflashctl", "status", "--json", "--window", "0", "--no-router",
                    "--no-systemd", "--state-dir", str(tmp_path / "no-rollout"), "--instance", str(f)]
            drop = "-dac_override,-dac_read_search"  # root as a user: the owner's bits decide
            wrap = ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", "--"] if as_user else []
            done = subprocess.run(wrap + argv, capture_output=True, text=True, env=ENV, timeout=60)
            rep = json.loads(done.stdout)
            assert schema.problems(rep, SCHEMA) == [], done.stderr
            return done.returncode, rep["instances"][0]

        locked = tmp_path / "locked"  # the key file in another user's directory, mode 0700
        locked.mkdir(mode=0o700)
        (locked / "key").write_text("s3cret\n")
        if os.geteuid() == 0:
            os.chown(locked, 65534, 65534)
        else:
            locked.chmod(0)
        for unreadable, as_user in ((locked / "key", os.geteuid() == 0), (tmp_path / "not-there", False)):
            code, row = run(as_user, apiKeyFile=str(unreadable))
            assert code == 0 and row["answers"] and row["http_status"] == 401 and row["problems"] == [], row
            assert row["metrics"] == "on" and row["requests_running"] == 0  # from /metrics, without the key
            [named] = [m for m in row["missing"] if m.startswith("API key: ")]
            assert str(unreadable) in named and "who can read it" in named
        locked.chmod(0o700)
        (tmp_path / "wrong").write_text("not-the-key\n")
        code, row = run(apiKeyFile=str(tmp_path / "wrong"))
        assert code == 1 and len(row["problems"]) == 1 and "refuses the key in its apiKeyFile" in row["problems"][0]
        code, row = run()
        assert code == 1 and "its settings name no apiKeyFile" in row["problems"][0]
        (tmp_path / "right").write_text("s3cret\n")
        code, row = run(apiKeyFile=str(tmp_path / "right"))
        assert code == 0 and row["http_status"] == 200 and row["served_model"] == "m"
        assert row["requests_running"] == 0 and not any(m.startswith("API key") for m in row["missing"])
    finally:
        proc.kill()
        proc.wait()


def test_only_the_gpus_an_instance_uses_are_judged(standin, tmp_path):
    """GPU 1 of two has a row remap pending. An instance with `gpus` empty uses the first tpSize GPUs
    (what serve watches): with tpSize 1 only GPU 0 is its, healthy; with tpSize 2, or GPU 1 made
    visible through its environment, GPU 1 is its and the instance is unhealthy."""
    nvml = build_fake_nvml(tmp_path / "nvml")
    scenario = Scenario(tmp_path / "remap.nvml", gpus=2).set("1.remapped_rows.pending", 1)
    base = json.loads(standin.read_text())
    env = {"LD_LIBRARY_PATH": str(nvml), "FAKE_NVML_SCENARIO": str(scenario.path)}
    seen = {}
    for name, extra in (("tp1", {}), ("tp2", {"tpSize": 2}), ("env1", {"environment": {"CUDA_VISIBLE_DEVICES": "1"}})):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({**base, **extra}))
        done = status("--json", "--window", "0", "--no-router", "--no-systemd", "--instance", str(f), env=env)
        rep = json.loads(done.stdout)
        assert schema.problems(rep, SCHEMA) == [] and rep["nvml_missing"] is None, done.stderr
        seen[name] = (done.returncode, [(g["index"], g["health"]) for g in rep["instances"][0]["gpus"]])
    assert seen == {"tp1": (0, [(0, "ok")]), "tp2": (1, [(0, "ok"), (1, "fault")]), "env1": (1, [(1, "fault")])}


class Mute:
    """A port that takes connections and never answers (a hung SGLang): what it was asked."""

    def __init__(self):
        import threading
        self.sock = listening(55535)  # an instance's port: at most 55535
        self.port, self.asked, self.conns = self.sock.getsockname()[1], [], []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            line = conn.recv(4096).split(b"\r\n")[0].decode(errors="replace")
            self.asked.append(line.split(" ")[1] if " " in line else line)

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


def test_what_does_not_answer_is_asked_once_and_not_waited_for(tmp_path):
    """Nothing listening at one instance, a hung server at another: each is asked for /model_info
    once, never for /v1/loads or /metrics, and with the default --window no second sample is taken
    (nothing answered that could give a rate). docs/benchmarks.md has the time it saves."""
    mute = Mute()
    try:
        refused = settings(tmp_path, "refused")
        hung = tmp_path / "hung.json"
        hung.write_text(json.dumps({"name": "hung", "model": "m", "port": mute.port}))
        done = status("--json", "--no-router", "--no-systemd", "--instance", str(refused), "--instance", str(hung))
        rep = json.loads(done.stdout)
        assert done.returncode == 1 and schema.problems(rep, SCHEMA) == [], done.stderr
        assert [r["answers"] for r in rep["instances"]] == [False, False]
        assert rep["window_s"] == 0  # one sample: nothing to rate
        assert mute.asked == ["/model_info"]
    finally:
        mute.close()


def test_a_second_sample_reads_only_the_metrics_that_answered(standin, tmp_path):
    """With an instance whose /metrics answers, the window is waited and its counters read twice:
    the stand-in's access log shows /model_info and /v1/loads once, /metrics twice."""
    done = status("--json", "--window", "0.5", "--no-router", "--no-systemd", "--instance", str(standin))
    rep = json.loads(done.stdout)
    assert done.returncode == 0 and rep["window_s"] >= 0.5, done.stderr
    assert rep["instances"][0]["tokens_per_s"] == 0 and rep["instances"][0]["tokens_per_s_source"] == "metrics"
    log = next(tmp_path.glob("standin-*.log")).read_text()
    asked = re.findall(r'"GET (\S+) HTTP', log)
    assert (asked.count("/model_info"), asked.count("/v1/loads?include=core"), asked.count("/metrics")) == (1, 1, 2)


# ------------------------------------------------------------------------- a rollout's state, read

def rollout_host(tmp_path: Path, state: dict | None, listed: dict[str, bool], answers: bool = True) -> dict:
    """status' report of two instances a and b behind a router that lists `listed` (url's instance ->
    healthy), with the rollout state `state` as RolloutLock writes it (None: no rollout ran)."""
    from dflashctl.operations import rollout_state, router, status, status_collect
    from dflashctl.operations.status_collect import InstanceSample, RouterSample, Sample
    from dflashctl.service import config
    cfgs = [config.from_dict({"name": n, "model": "m", "port": p}) for n, p in (("a", 30000), ("b", 30001))]
    state_dir = tmp_path / "state"
    if state is not None:
        with rollout_state.RolloutLock(state_dir) as lock:  # as the rollout writes it: holding its lock
            lock.write(state)
    found, why, unreadable = status_collect.read_rollout([state_dir])
    rows = [InstanceSample(c, answers=answers or c.name == "b", http_status=200 if answers or c.name == "b" else None)
            for c in cfgs]
    by_name = {c.name: c.base_url for c in cfgs}
    rs = RouterSample(router.from_dict({"workers": list(by_name.values())}),
                      workers={by_name[n]: ok for n, ok in listed.items()})
    rep = status.report([Sample(0.0, time.time(), rows, rs, "--no-systemd", "no driver", found, why, unreadable)],
                        {"a": None, "b": None})
    assert schema.problems(rep, SCHEMA) == []
    return rep


def a_rollout(pid: int, status: str, current: list[str], left: dict[str, str]) -> dict:
    """The state as operations/rollout.py's Rollout.save writes it."""
    return {"pid": pid, "started": time.time() - 60, "status": status, "current": current,
            "left_out": {n: {"reason": r, "url": f"http://127.0.0.1:{30000 + 'ab'.index(n)}", "before": None}
                         for n, r in left.items()}}


def texts(rep: dict) -> str:
    return json.dumps(rep) + render(rep)


def render(rep: dict) -> str:
    from dflashctl.operations import status
    return status.render(rep)


def test_a_worker_missing_from_the_router_with_no_rollout_is_sent_to_a_reload(tmp_path):
    rep = rollout_host(tmp_path, None, {"b": True})
    assert rep["exit_code"] == 1 and rep["rollout"] is None and rep["rollout_missing"].startswith("no rollout has run")
    [problem] = rep["router"]["problems"]
    assert "(instance a) is not in the router's list" in problem and "`systemctl reload dflash-router`" in problem


def test_a_stopped_rollout_is_named_with_its_reason_and_resume_never_a_reload(tmp_path):
    reason = "a: not ready 4 s after its restart"
    rep = rollout_host(tmp_path, a_rollout(os.getpid(), "failed", [], {"a": reason}), {"b": True})
    assert rep["exit_code"] == 1 and rep["rollout"]["status"] == "failed" and not rep["rollout"]["running"]
    assert [w["instance"] for w in rep["rollout"]["left_out"]] == ["a"]
    [router_problem] = rep["router"]["problems"]
    assert reason in router_problem and "`dflashctl rollout --resume`" in router_problem
    [rollout_problem] = rep["rollout"]["problems"]
    assert "failed" in rollout_problem and reason in rollout_problem and "--resume" in rollout_problem
    assert rep["instances"][0]["rollout"] == {"state": "left out", "reason": reason}
    assert "systemctl reload" not in texts(rep)


def test_a_running_rollout_is_said_not_failed(tmp_path):
    """The rollout's own process (its pid runs `... rollout ...`) restarting a, which is out of the
    router and does not answer: notes, exit 0, and no reload advised."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "rollout"])
    try:
        state = a_rollout(proc.pid, "running", ["a"], {"a": "taken out for its restart (the rollout had not "
                                                        "finished it)"})
        rep = rollout_host(tmp_path, state, {"b": True}, answers=False)
        assert rep["exit_code"] == 0 and rep["problems"] == [], rep["problems"]
        assert rep["rollout"]["running"] and rep["rollout"]["current"] == ["a"]
        a = rep["instances"][0]
        assert a["rollout"]["state"] == "restarting" and a["problems"] == []
        assert a["notes"] == [f"does not answer at {a['url']} (restarting by the rollout)"]
        [note] = rep["router"]["notes"]
        assert "(instance a) is out of the router for the rollout" in note
        text = render(rep)
        assert "rollout (pid" in text and "restarting: a" in text and "systemctl reload" not in texts(rep)
        # b missing too, but not the rollout's: no reload while it runs (it would undo its work)
        rep = rollout_host(tmp_path, state, {}, answers=False)
        [problem] = rep["router"]["problems"]
        assert "(instance b)" in problem and "a rollout is running" in problem and "let it finish" in problem
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("pid", ["gone", "reused"])
def test_a_rollout_whose_process_is_gone_is_interrupted_with_the_resume_fix(tmp_path, pid):
    """Its state says running, but its pid is gone (killed, a reboot) or now another program's."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    if pid == "gone":
        other.kill()
        other.wait()
    try:
        rep = rollout_host(tmp_path, a_rollout(other.pid, "running", ["a"], {"a": "taken out for its restart"}),
                           {"b": True})
    finally:
        other.kill()
        other.wait()
    assert rep["exit_code"] == 1 and rep["rollout"]["running"] is False and rep["rollout"]["status"] == "running"
    [problem] = rep["rollout"]["problems"]
    assert "stopped without finishing" in problem and f"pid {other.pid}" in problem and "--resume" in problem
    [router_problem] = rep["router"]["problems"]
    assert "the rollout that stopped left it out" in router_problem and "--resume" in router_problem
    assert "systemctl reload" not in texts(rep)
    assert "stopped: its process is gone" in render(rep)


def test_a_rollout_state_that_cannot_be_read_is_named_and_hedges_the_advice(tmp_path):
    """A state this user may not read (the unit's StateDirectory is root's, mode 0700): named under
    `not read`, and a missing worker gets the reload only 'if no rollout did'."""
    state_dir = tmp_path / "state"
    from dflashctl.operations import rollout_state
    with rollout_state.RolloutLock(state_dir) as lock:
        lock.write(a_rollout(1, "failed", [], {"a": "x"}))
    state_dir.chmod(0o700)
    probe = ("import json, sys; from pathlib import Path; from dflashctl.operations import status_collect; "
             "print(json.dumps(status_collect.read_rollout([Path(sys.argv[1])])[1:]))")
    argv = [sys.executable, "-c", probe, str(state_dir)]
    if os.geteuid() == 0:  # root reads any mode: the directory another user's, root without DAC override
        os.chown(state_dir, 65534, 65534)
        drop = "-dac_override,-dac_read_search"
        done = subprocess.run(["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", "--", *argv],
                              capture_output=True, text=True, env=ENV, timeout=60)
        os.chown(state_dir, 0, 0)
    else:
        state_dir.chmod(0)
        done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=60)
        state_dir.chmod(0o700)
    why, unreadable = json.loads(done.stdout)
    assert unreadable is True and "Permission denied" in why and "run as root" in why, done.stderr
    (state_dir / "state.json").write_text('{"version": 99}')  # a state of another version: not guessed at
    rep = rollout_host(tmp_path, None, {"b": True})
    assert rep["rollout"] is None and "not a rollout state this dflashctl reads" in rep["rollout_missing"]
    [problem] = rep["router"]["problems"]
    assert "a rollout may have left it out" in problem and "if none did, `systemctl reload dflash-router`" in problem
    assert "rollout: " in render(rep)


@needs_router
@pytest.mark.slow
def test_status_beside_a_real_rollout_then_after_it_was_killed(tmp_path):
    """`dflashctl rollout` through the real router, `dflashctl serve` instances under the test
    supervisor (tests/rollout_harness.py), its restart of gpu0 held at a gate: status names the
    rollout restarting gpu0, out of the router on purpose (exit 0, no reload advised). Killed
    (SIGKILL: its state still says running), status says so with the --resume fix (exit 1, still
    no reload); `dflashctl rollout --resume` then makes the host healthy, as status says."""
    sup = Supervisor(tmp_path)
    files = []
    for i in range(2):
        path = tmp_path / f"gpu{i}.json"
        path.write_text(json.dumps({"name": f"gpu{i}", "model": "standin-model", "port": free_port(55535),
                                    "environment": {"STANDIN_READY_AFTER": "0.5"}}))
        files.append(path)
        sup.add(f"gpu{i}", serve_argv(path, STANDIN), dict(ENV, LOGS_DIRECTORY=str(tmp_path)))
    urls = [f"http://127.0.0.1:{json.loads(f.read_text())['port']}" for f in files]
    gate, abort, held = tmp_path / "gate", tmp_path / "abort", tmp_path / "held.pid"
    hold = (f"sh -c 'echo $$ > {held}; while [ ! -e {gate} ]; do sleep 0.05; done; [ -e {abort} ] && exit 1; "
            f"exec \"$@\"' sh {sup.restart_command}")
    common = ["--state-dir", str(tmp_path / "state"), "--router", str(tmp_path / "router.json"),
              *[x for f in files for x in ("--instance", str(f))]]
    rt = None
    try:
        sup.serve_control().start_all()
        rt = Router({"workers": urls}, tmp_path).start()
        rt.wait_healthy(urls)
        (tmp_path / "router.json").write_text(json.dumps(rt.settings))
        rollout = subprocess.Popen([sys.executable, "-m", "dflashctl", "rollout", "--restart-command", hold,
                                    "--healthy-for", "1", "--only", "gpu0", *QUICK_CANARY, *common], env=ENV,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in rollout.stderr:
            if "gpu0: restarting" in line:
                break
        deadline = time.monotonic() + 60
        while not held.exists():  # the restart command runs, held at the gate
            assert rollout.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)

        done = status("--json", "--window", "0", *common)
        rep = json.loads(done.stdout)
        assert schema.problems(rep, SCHEMA) == [] and done.returncode == 0, (rep["problems"], done.stderr)
        assert rep["rollout"]["running"] and rep["rollout"]["current"] == ["gpu0"]
        assert rep["rollout"]["pid"] == rollout.pid
        gpu0 = rep["instances"][0]
        assert gpu0["rollout"]["state"] == "restarting" and gpu0["answers"]  # out of the router, still up
        assert [w["instance"] for w in rep["router"]["workers_not_listed"]] == ["gpu0"]
        [note] = rep["router"]["notes"]
        assert "(instance gpu0) is out of the router for the rollout" in note
        assert "systemctl reload" not in done.stdout

        rollout.kill()
        rollout.wait()
        done = status("--json", "--window", "0", *common)
        rep = json.loads(done.stdout)
        assert done.returncode == 1 and rep["rollout"]["running"] is False, done.stderr
        assert any("stopped without finishing" in p and "--resume" in p for p in rep["problems"]), rep["problems"]
        [router_problem] = rep["router"]["problems"]
        assert "(instance gpu0)" in router_problem and "--resume" in router_problem
        text = status("--window", "0", *common)
        assert text.returncode == 1 and "systemctl reload" not in text.stdout + done.stdout
        assert "stopped: its process is gone" in text.stdout

        abort.touch()  # the killed rollout's restart command gives up at the gate
        gate.touch()
        resumed = subprocess.run([sys.executable, "-m", "dflashctl", "rollout", "--restart-command",
                                  sup.restart_command, "--healthy-for", "1", "--resume", "--only", "gpu0", *QUICK_CANARY,
                                      *common],
                                 env=ENV, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        done = status("--json", "--window", "0", *common)
        rep = json.loads(done.stdout)
        assert done.returncode == 0 and rep["rollout"]["status"] == "done" and rep["problems"] == [], rep["problems"]
    finally:
        abort.touch()
        gate.touch()
        if rt is not None:
            rt.stop()
        sup.shutdown()
