"""`dflashctl unit`: golden units, `systemd-analyze verify`, the exposure score, and the shared data file."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl import cli, errors
from dflashctl.service import config, serve, unit

HERE = Path(__file__).parent
GOLDEN = HERE / "data" / "service" / "units"
SETTINGS = HERE / "data" / "service" / "argv"
REPO = HERE.parent
CASES = ["dflash", "ddtree", "none", "pinned"]
MAX_EXPOSURE = 2.0


def settings(case: str) -> dict:
    return json.loads((SETTINGS / f"{case}.json").read_text())["settings"]


@pytest.mark.parametrize("case", CASES)
def test_golden_unit(case):
    cfg = config.from_dict(settings(case))
    text = unit.render(cfg, f"/etc/dflash/{cfg.name}.json", "/opt/dflash/bin/dflashctl", systemd=256)
    path = GOLDEN / f"dflash-{cfg.name}.service"
    if os.environ.get("DFLASH_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_restart_prevent_matches_errors():
    data = unit.unit_data()
    assert tuple(data["service"]["RestartPreventExitStatus"]) == errors.NO_RESTART
    # and crashes are not in it: they restart with backoff
    for code in (errors.SERVER_DIED_BEFORE_READY, errors.SERVER_DIED_AFTER_READY, errors.SERVER_START_TIMEOUT):
        assert code not in data["service"]["RestartPreventExitStatus"]


def test_credential_names_shared_with_serve():
    assert unit.unit_data()["apiKeyCredential"] == serve.API_KEY_CREDENTIAL
    assert unit.unit_data()["hfTokenCredential"] == serve.HF_TOKEN_CREDENTIAL


def test_every_relaxed_line_says_why():
    data = unit.unit_data()
    s = data["service"]
    relaxed = [k for k in ("PrivateDevices", "MemoryDenyWriteExecute", "PrivateIPC") if s.get(k) is False]
    relaxed += ["DeviceAllow", "ProcSubset", "RestrictAddressFamilies", "SystemCallFilter", "KillMode"]
    assert not [k for k in relaxed if k not in data["why"]]
    assert set(data["why"]) <= set(s) | set(data["unit"])  # no reason for a directive that is gone


def test_older_systemd_drops_what_it_does_not_know():
    cfg = config.from_dict(settings("none"))
    old = unit.render(cfg, "/etc/dflash/x.json", "/bin/true", systemd=252)
    new = unit.render(cfg, "/etc/dflash/x.json", "/bin/true", systemd=256)
    assert "RestartSteps=" not in old and "RestartSteps=" in new
    assert "Left out for systemd 252: RestartSteps, RestartMaxDelaySec" in old


def test_exec_start_escapes_specifiers(tmp_path):
    cfg = config.from_dict({"name": "a", "model": "m"})
    text = unit.render(cfg, "/etc/dflash/50%.json", "/opt/my dflash/bin/dflashctl")
    assert "ExecStart='/opt/my dflash/bin/dflashctl' serve --config /etc/dflash/50%%.json" in text


def test_module_reads_the_same_file():
    module = (REPO / "nix" / "module.nix").read_text()
    assert "../python/dflashctl/service/data/service-unit.json" in module


def render_real(tmp_path: Path, case: str) -> Path:
    """The unit through the CLI, with an ExecStart that exists (verify checks it)."""
    f = tmp_path / f"{case}.json"
    f.write_text(json.dumps(settings(case)))
    name = config.from_dict(settings(case)).name
    out = tmp_path / f"dflash-{name}.service"
    assert cli.main(["unit", "--config", str(f), "--dflashctl", sys.executable, "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("case", CASES)
def test_systemd_analyze_verify(tmp_path, case):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    path = render_real(tmp_path, case)
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Unknown key" not in r.stderr and "Unknown section" not in r.stderr, r.stderr


def test_exposure_score(tmp_path, record_property):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    path = render_real(tmp_path, "dflash")
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                       capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    score = float(m.group(1))
    record_property("exposure", score)
    print(f"systemd-analyze security exposure: {score}")
    assert score <= MAX_EXPOSURE


def test_cli_install_hint(tmp_path, capsys):
    render_real(tmp_path, "none")
    err = capsys.readouterr().err
    assert "systemctl daemon-reload && systemctl enable --now dflash-plain.service" in err
    assert "/etc/dflash/plain.json" in err


def test_cli_refuses_relative_dflashctl(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "a", "model": "m"}))
    assert cli.main(["unit", "--config", str(f), "--dflashctl", "bin/dflashctl"]) == errors.FAILED
    assert "is not absolute" in capsys.readouterr().err
