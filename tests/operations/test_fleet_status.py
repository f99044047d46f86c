"""`dflashctl status --host NAME=FILE`: a fleet's reports read together (operations/fleet_status.py).

Each host's report is a real `dflashctl status --json` of a host whose instance does not answer
(unhealthy, exit 1); the healthy host is that report as a healthy host writes it (the fields the
fleet reads set as status.py sets them). The single-host output is untouched: --host reads no
instance and no router.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from router_harness import free_port

DFLASHCTL = [sys.executable, "-m", "dflashctl"]


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*DFLASHCTL, *argv], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def reports(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"name": "gpu0", "model": "m", "port": free_port(55535)}))
    r = run("status", "--instance", "a.json", "--no-router", "--no-systemd", "--window", "0", "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    down = json.loads(r.stdout)
    (tmp_path / "down.json").write_text(r.stdout)
    up = {**down, "healthy": True, "exit_code": 0, "problems": [],
          "instances": [{**down["instances"][0], "healthy": True, "answers": True, "problems": [],
                         "accept_length": 6.5}],
          "router": {"workers_in_rotation": [{"url": "http://127.0.0.1:30000", "instance": "gpu0"}],
                     "workers_out_of_rotation": [], "requests_per_s": 12.5}}
    (tmp_path / "up.json").write_text(json.dumps(up))
    return tmp_path


def test_a_fleet_with_one_host_down_names_it_and_fails(reports):
    r = run("status", "--host", "gpu-a=up.json", "--host", "gpu-b=down.json", cwd=reports)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:3] == ["gpu-a", "healthy", "1/1"] and "12.5" in lines[1] and "6.50" in lines[1]
    assert lines[2].split()[:3] == ["gpu-b", "UNHEALTHY", "0/1"]
    assert "fleet: 1 of 2 host(s) healthy" in r.stdout
    assert "gpu-b: gpu0: does not answer" in r.stdout and "gpu-a:" not in r.stdout.split("fleet:")[1]


def test_json_is_one_object_and_a_healthy_fleet_exits_0(reports):
    r = run("status", "--host", "gpu-a=up.json", "--host", "gpu-c=up.json", "--json", cwd=reports)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["format"] == "dflashctl-fleet-status" and out["healthy"] and out["problems"] == []
    assert [(h["name"], h["instances_healthy"], h["in_rotation"]) for h in out["hosts"]] == [("gpu-a", 1, 1),
                                                                                          ("gpu-c", 1, 1)]


def test_a_file_that_is_not_a_report_is_named(reports):
    r = run("status", "--host", "gpu-a=a.json", "--json", cwd=reports)
    assert r.returncode == 66, r.stderr
    err = json.loads(r.stdout)["error"]
    assert "a.json is not a `dflashctl status --json` report" in err["what"] and "gpu-a" in err["fix"]
