"""`dflashctl unit`: golden units, `systemd-analyze verify`, the exposure score, and the shared data file."""

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import update_golden

from dflashctl import cli, errors
from dflashctl.service import config, serve, unit

HERE = Path(__file__).parent.parent
GOLDEN = HERE / "data" / "service" / "units"
SETTINGS = HERE / "data" / "service" / "argv"
REPO = HERE.parent
CASES = ["dflash", "ddtree", "none", "pinned"]
MAX_EXPOSURE = 1.6


def settings(case: str) -> dict:
    return json.loads((SETTINGS / f"{case}.json").read_text())["settings"]


@pytest.mark.golden
@pytest.mark.parametrize("case", CASES)
def test_golden_unit(case):
    cfg = config.from_dict(settings(case))
    text = unit.render(cfg, f"/etc/dflash/{cfg.name}.json", "/opt/dflash/bin/dflashctl", systemd=256)
    path = GOLDEN / f"dflash-{cfg.name}.service"
    update_golden(path, text)
    assert text == path.read_text()


@pytest.mark.parametrize("case", CASES)
def test_the_digest_covers_every_line_the_unit_writes(case, monkeypatch):
    """What `dflashctl unit` hashes into DFLASH_UNIT_DIGEST is, line for line, what it writes into
    the unit file but comments and the digest's own line (and the settings, whose file can change
    under the same path); NixOS's unit follows the same rule (tests/operations/test_rollout_unit.py)."""
    hashed = []
    real = unit.definition_digest
    monkeypatch.setattr(unit, "definition_digest",
                        lambda written: hashed.append(copy.deepcopy(written)) or real(written))
    cfg = config.from_dict(settings(case))
    text = unit.render(cfg, f"/etc/dflash/{cfg.name}.json", "/opt/dflash/bin/dflashctl", systemd=256)
    [written] = hashed
    assert written["settings"] == config.to_dict(cfg)
    lines = [line for line in text.splitlines()
             if line and not line.startswith("#") and not line.startswith("DFLASH_UNIT_DIGEST=", len("Environment="))]
    want = []
    for section in ("Unit", "Service", "Install"):
        want.append(f"[{section}]")
        for key, value in written[section].items():
            want += [f"{key}={unit._value(v)}" for v in (value if isinstance(value, list) else [value])]
    assert lines == want
    assert f"Environment=DFLASH_UNIT_DIGEST={real(written)}" in text.splitlines()


def test_the_digest_changes_with_the_settings_and_the_systemd_version():
    cfg = config.from_dict(settings("none"))

    def digest(c, systemd=256, path="/etc/dflash/x.json"):
        text = unit.render(c, path, "/opt/dflash/bin/dflashctl", systemd=systemd)
        return re.search(r"^Environment=DFLASH_UNIT_DIGEST=([0-9a-f]+)$", text, re.M).group(1)
    base = digest(cfg)
    assert digest(cfg) == base and len(base) == unit.unit_data()["digest"]["hexDigits"]
    other = config.from_dict({**settings("none"), "memFractionStatic": 0.5})
    changed = {"a setting ExecStart does not show": digest(other),
               "a directive older systemd lacks": digest(cfg, systemd=252),
               "the settings path": digest(cfg, path="/etc/dflash/y.json")}
    assert base not in changed.values() and len(set(changed.values())) == 3, changed


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


def test_exec_start_is_quoted_by_systemd_rules():
    """Issue 9 #3: shell quoting let systemd C-unescape a backslash and expand $."""
    cfg = config.from_dict({"name": "a", "model": "m"})
    text = unit.render(cfg, "/etc/dflash/50% $HOME\\b.json", "/opt/my dflash/bin/dflashctl")
    assert ('ExecStart="/opt/my dflash/bin/dflashctl" serve --config "/etc/dflash/50%% $$HOME\\\\b.json"'
            in text)


@pytest.mark.parametrize("path", ["/opt/$x/dflashctl", '/opt/"q"/dflashctl', "/opt/it's/dflashctl",
                                  "/opt/a\\b/dflashctl", "/opt/x\ny/dflashctl", "bin/dflashctl"])
def test_unplain_executable_paths_are_refused(tmp_path, capsys, path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "a", "model": "m"}))
    assert cli.main(["unit", "--config", str(f), "--dflashctl", path]) == errors.CONFIG
    err = capsys.readouterr().err
    assert "cannot go into ExecStart" in err and "--dflashctl" in err


def test_a_newline_in_the_config_path_is_refused(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "a", "model": "m"}))
    rc = cli.main(["unit", "--config", str(f), "--dflashctl", "/bin/true",
                   "--config-path", "/etc/x.json\nExecStartPre=+/bin/sh"])
    assert rc == errors.CONFIG
    assert "U+000A" in capsys.readouterr().err


@pytest.mark.parametrize("key,value", [
    ("model", "m\n[Service]\nExecStartPre=+/bin/sh -c id"),
    ("cacheDir", "/var/cache/hf\nExecStartPre=+/bin/sh -c id"),
    ("apiKeyFile", "/run/k\nExecStartPre=+/bin/sh -c id"),
])
def test_injection_through_settings_is_refused(tmp_path, capsys, key, value):
    """Issue 9 #1: a newline in a setting put a root ExecStartPre into the unit."""
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "a", "model": "m", key: value}))
    assert cli.main(["unit", "--config", str(f), "--dflashctl", "/bin/true"]) == errors.CONFIG
    assert f"{key}: contains the control character U+000A" in capsys.readouterr().err


def test_percent_in_description_and_credential_is_escaped():
    """Issue 9 #2: % was left for systemd to expand."""
    cfg = config.from_dict({"name": "a", "model": "org/50%-model", "apiKeyFile": "/run/keys/50%h"})
    text = unit.render(cfg, "/etc/dflash/a.json", "/bin/true")
    assert "Description=DFlash SGLang instance a (org/50%%-model)" in text
    assert "LoadCredential=api-key:/run/keys/50%%h" in text


def test_cache_dir_is_systemd_owned_or_refused(capsys, tmp_path):
    """Issue 9 #4: cacheDir was never created or owned; under DynamicUser only systemd can own it."""
    cfg = config.from_dict({"name": "a", "model": "m", "cacheDir": "/var/cache/hf"})
    text = unit.render(cfg, "/etc/dflash/a.json", "/bin/true")
    assert "CacheDirectory=%N\nCacheDirectory=hf\n" in text and "ReadWritePaths" not in text
    cfg = config.from_dict({"name": "a", "model": "m", "cacheDir": "/var/lib/hf"})
    assert "StateDirectory=hf\nStateDirectoryMode=0700" in unit.render(cfg, "/e.json", "/bin/true")
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "a", "model": "m", "cacheDir": "/srv/hf"}))
    assert cli.main(["unit", "--config", str(f), "--dflashctl", "/bin/true"]) == errors.CONFIG
    err = capsys.readouterr().err
    assert "/srv/hf is outside /var/cache and /var/lib" in err and "static user" in err


@pytest.mark.parametrize("path,by", [("/home/me/hf", "ProtectHome"), ("/root/hf", "ProtectHome"),
                                     ("/run/user/1000/hf", "ProtectHome"), ("/tmp/hf", "PrivateTmp"),
                                     ("/var/tmp/hf", "PrivateTmp")])
def test_cache_dir_hidden_by_the_sandbox_is_refused(path, by):
    cfg = config.from_dict({"name": "a", "model": "m", "cacheDir": path})  # fine outside systemd
    with pytest.raises(errors.DflashError) as e:
        unit.render(cfg, "/etc/dflash/a.json", "/bin/true")
    assert e.value.exit_code == errors.CONFIG
    assert f"{path} is hidden from the service by {by}=true" in str(e.value)
    assert "/var/cache" in str(e.value)


# --- restart policy: computed from the unit's own directives ----------------------------------------

def directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def seconds(value: str) -> float:
    return float(value.removesuffix("s"))


def restart_sequence(d: dict[str, str], runtime_s: float = 0.0) -> dict:
    """What systemd does to a service that fails `runtime_s` after each start.

    Delays as service_restart_usec_next() (systemd >= 254): restart k waits
    RestartSec * (RestartMaxDelaySec/RestartSec) ** ((k-1)/RestartSteps), RestartMaxDelaySec
    after RestartSteps; without RestartSteps always RestartSec. Starts are counted by
    ratelimit_below(): a window opens at a start, more than StartLimitBurst starts in
    StartLimitIntervalSec are refused and the unit stays failed.
    """
    base = seconds(d["RestartSec"])
    steps = int(d.get("RestartSteps", 0))
    cap = seconds(d.get("RestartMaxDelaySec", d["RestartSec"]))
    burst, interval = int(d["StartLimitBurst"]), seconds(d["StartLimitIntervalSec"])
    t, begin, num, delays = 0.0, 0.0, 1, []
    while len(delays) < 10_000:
        k = len(delays) + 1
        delay = base if k <= 1 or steps == 0 or cap <= base else (
            cap if k > steps else base * (cap / base) ** ((k - 1) / steps))
        t += runtime_s + delay
        delays.append(delay)
        if t - begin > interval:
            begin, num = t, 1
        else:
            num += 1
            if num > burst:
                return {"delays": delays[:-1], "gave_up_at_s": t, "restarts": k - 1}
    return {"delays": delays, "gave_up_at_s": None, "restarts": len(delays)}


def test_restart_backoff_reaches_its_cap_before_the_start_limit():
    """Issue 9 #5: 5 starts per 30 min stopped a crash loop at a 77 s delay, never reaching 300 s."""
    text = unit.render(config.from_dict(settings("none")), "/e.json", "/bin/true", systemd=256)
    d = directives(text)
    seq = restart_sequence(d)
    cap = seconds(d["RestartMaxDelaySec"])
    assert cap in seq["delays"], seq
    at_cap = seq["delays"].index(cap) + 1
    assert at_cap == int(d["RestartSteps"]) + 1 == 7
    assert seq["restarts"] == 11 and seq["restarts"] - at_cap + 1 >= 5  # several tries at the cap
    assert [round(x) for x in seq["delays"][:7]] == [5, 10, 20, 39, 77, 152, 300]
    assert 2000 < seq["gave_up_at_s"] < 2200  # about 35 minutes of a crash loop, as docs say
    # a service that runs 10 minutes before each crash never hits the limit: the window moves on
    assert restart_sequence(d, runtime_s=600)["gave_up_at_s"] is None


def test_restart_policy_on_systemd_before_254():
    """Without RestartSteps (dropped for systemd < 254): 5 s apart, 11 restarts, then failed."""
    text = unit.render(config.from_dict(settings("none")), "/e.json", "/bin/true", systemd=252)
    seq = restart_sequence(directives(text))
    assert set(seq["delays"]) == {5.0} and seq["restarts"] == 11


def test_module_reads_the_same_file():
    """The module's units come from nix/lib/service-unit.nix, which reads this data file."""
    assert "import ../lib/service-unit.nix" in (REPO / "nix" / "modules" / "instances.nix").read_text()
    lib = (REPO / "nix" / "lib" / "service-unit.nix").read_text()
    assert "../../python/dflashctl/service/data/service-unit.json" in lib


def render_real(tmp_path: Path, case: str) -> Path:
    """The unit through the CLI, with an ExecStart that exists (verify checks it) where the unit's
    sandbox can see it (a venv's python may lead into /root: `unit` refuses that)."""
    f = tmp_path / f"{case}.json"
    f.write_text(json.dumps(settings(case)))
    name = config.from_dict(settings(case)).name
    out = tmp_path / f"dflash-{name}.service"
    assert cli.main(["unit", "--config", str(f), "--dflashctl", shutil.which("true"), "-o", str(out)]) == 0
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
    assert cli.main(["unit", "--config", str(f), "--dflashctl", "bin/dflashctl"]) == errors.CONFIG
    assert "is not an absolute path" in capsys.readouterr().err
