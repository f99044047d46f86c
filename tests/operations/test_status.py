"""`dflashctl status` where parts of a host are missing, its JSON held to docs/status.schema.json,
`--watch` on a terminal and off it, and the Prometheus text reader over the H200 recordings.

The full host (the real router, stand-ins, a stopped worker) is tests/operations/test_monitoring.py's; the
unit state and journal under a real systemd are tests/service/test_systemd.py's.
"""

import json
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
from router_harness import ENV, STANDIN, free_port, request

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


@pytest.fixture
def standin(tmp_path):
    port = free_port(55535)
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port), "--host", "127.0.0.1",
                             "--model-path", "m", "--enable-metrics"], env=dict(ENV, STANDIN_READY_AFTER="0"),
                            stdout=open(tmp_path / "standin.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while request(f"http://127.0.0.1:{port}/health", timeout=2)[0] != 200:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
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
