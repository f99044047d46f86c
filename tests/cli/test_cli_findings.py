"""The ten findings of issue 34 ("Every command keeps its contract on bad input"), one regression
test each (or a few, where a finding named several commands). The contract over the whole CLI is
tests/cli/test_cli_contract.py; what only a real systemd can show is in tests/service/test_systemd.py."""

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl import cli, errors
from dflashctl.service import models, unit_paths, unit_text

REPO = Path(__file__).resolve().parent.parent.parent
TRUE = shutil.which("true")  # an executable a unit's sandbox can see
SETTINGS = {"name": "a", "model": "Qwen/Qwen3-8B", "gpus": [0]}


def main(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def settings_file(tmp_path: Path, data: dict, name: str = "s.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def run(*argv, cwd=None, fsize=None, env=None) -> subprocess.CompletedProcess:
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return subprocess.run([sys.executable, "-m", "dflashctl", *map(str, argv)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, preexec_fn=limit, env={**os.environ, **(env or {})})


# --- 1. a unit that cannot start --------------------------------------------------------------------

@pytest.mark.parametrize("flag,path,hidden_by", [
    ("--dflashctl", "/home/me/.venv/bin/dflashctl", "ProtectHome=true"),
    ("--dflashctl", "/root/stack/bin/dflashctl", "ProtectHome=true"),
    ("--python", "/root/stack/bin/python", "ProtectHome=true"),
    ("--config-path", "/tmp/gpu0.json", "PrivateTmp=true"),
    ("--config-path", "/var/tmp/gpu0.json", "PrivateTmp=true"),
])
def test_a_path_the_sandbox_hides_is_refused_with_the_fix(tmp_path, capsys, flag, path, hidden_by):
    extra = [] if flag == "--dflashctl" else ["--dflashctl", TRUE]
    rc, out, err = main(capsys, "unit", "--config", settings_file(tmp_path, SETTINGS), flag, path, *extra)
    assert rc == errors.CONFIG and out == ""
    assert f"{path} is hidden from the service by {hidden_by}" in err
    assert err.splitlines()[-1].startswith("  fix: ")


def test_a_relative_config_path_is_refused(tmp_path, capsys):
    rc, _, err = main(capsys, "unit", "--config", settings_file(tmp_path, SETTINGS), "--dflashctl", TRUE,
                      "--config-path", "gpu0.json")
    assert rc == errors.CONFIG and "must be an absolute path" in err


def test_a_venv_whose_python_leads_into_a_hidden_directory_is_refused(tmp_path, capsys, monkeypatch):
    """The venv in /opt is fine, but its python links to an interpreter the sandbox hides (pyenv in
    /root): the script's #! line is followed too. Here one directory of the test plays the hidden
    one and the rest of it /opt, wherever TMPDIR is (a TMPDIR under /tmp would hide the venv itself)."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    interpreter = hidden / "python3.12"  # a file, not a link: where the links end
    interpreter.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    interpreter.chmod(0o755)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(interpreter)
    script = venv / "dflashctl"
    script.write_text(f"#!{venv / 'python'}\nimport sys\n")
    script.chmod(0o755)
    data = unit_text.unit_data()
    monkeypatch.setattr(unit_text, "unit_data", lambda: {**data, "hidden": {str(hidden): "PrivateTmp=true"}})
    rc, _, err = main(capsys, "unit", "--config", settings_file(tmp_path, SETTINGS), "--dflashctl", script,
                      "--python", TRUE)
    assert rc == errors.CONFIG, err
    assert f"its #! line runs {venv / 'python'}, and it leads to {interpreter}" in err
    assert f"{interpreter} is hidden from the service by PrivateTmp=true" in err


def test_a_hidden_path_that_leads_into_the_store_is_named_by_its_store_path(tmp_path, capsys, monkeypatch):
    """~/.nix-profile/bin/dflashctl is under /root, but its links lead into the Nix store: the unit
    runs the store path. Here a directory of this test plays /home and another the store."""
    home, store = tmp_path / "home", tmp_path / "store"
    env = store / "aaaa-dflash-env" / "bin"
    env.mkdir(parents=True)
    (env / "dflashctl").write_text("#!/bin/sh\nexit 0\n")
    (env / "dflashctl").chmod(0o755)
    profile = store / "bbbb-profile"
    profile.mkdir()
    (profile / "bin").symlink_to(env)
    (home / "me").mkdir(parents=True)
    (home / "me" / ".nix-profile").symlink_to(profile)
    data = unit_text.unit_data()
    monkeypatch.setattr(unit_text, "unit_data", lambda: {**data, "hidden": {str(home): "ProtectHome=true"}})
    monkeypatch.setattr(unit_paths, "STORE", str(store))
    given = str(home / "me" / ".nix-profile" / "bin" / "dflashctl")
    rc, out, err = main(capsys, "unit", "--config", settings_file(tmp_path, SETTINGS), "--dflashctl", given)
    assert rc == 0, err
    assert f"ExecStart={env / 'dflashctl'} serve --config /etc/dflash/a.json\n" in out
    # and what is hidden and leads nowhere into the store is still refused
    (home / "me" / "venv").mkdir()
    plain = home / "me" / "venv" / "dflashctl"
    plain.write_text("#!/bin/sh\n")
    rc, _, err = main(capsys, "unit", "--config", settings_file(tmp_path, SETTINGS), "--dflashctl", plain)
    assert rc == errors.CONFIG and "hidden from the service by ProtectHome=true" in err


def test_a_local_model_the_sandbox_hides_is_refused(tmp_path, capsys):
    rc, _, err = main(capsys, "unit", "--config", settings_file(tmp_path, {**SETTINGS, "model": "/home/me/qwen"}),
                      "--dflashctl", TRUE)
    assert rc == errors.CONFIG and "model of instance 'a' cannot be used by this unit" in err


def test_a_credential_file_missing_at_render_time_is_named(tmp_path, capsys):
    """LoadCredential files are read by systemd before the sandbox (anywhere is fine), but one that
    does not exist fails the start: `unit` says so, and renders the fallback that lets serve name it."""
    data = {**SETTINGS, "apiKeyFile": str(tmp_path / "absent.key"), "hfTokenFile": "/root/hf-token"}
    rc, out, err = main(capsys, "unit", "--config", settings_file(tmp_path, data), "--dflashctl", TRUE)
    assert rc == 0
    assert f"warning: apiKeyFile {tmp_path / 'absent.key'} does not exist on this host" in err
    fallback = unit_text.unit_data()["credentialFallback"]
    assert f"LoadCredential=hf-token:/root/hf-token\n" in out and f"SetCredential=hf-token:{fallback}\n" in out


def test_serve_names_the_file_systemd_could_not_load(tmp_path, capsys):
    """What the service does with the unit's SetCredential fallback: exit 78, naming the file."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text(unit_text.unit_data()["credentialFallback"])
    cfg = settings_file(tmp_path, {**SETTINGS, "apiKeyFile": "/run/secrets/dflash-key"})
    os.environ["CREDENTIALS_DIRECTORY"] = str(creds)
    try:
        rc, _, err = main(capsys, "serve", "--config", cfg, "--skip-preflight", "--launcher", "/bin/false")
    finally:
        del os.environ["CREDENTIALS_DIRECTORY"]
    assert rc == errors.CONFIG
    assert "systemd could not read apiKeyFile /run/secrets/dflash-key for the API key" in err
    assert err.splitlines()[-1].startswith("  fix: create /run/secrets/dflash-key")


# --- 2. output paths --------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["/nonexistent/x.service", "{tmp}"])
def test_unit_to_an_unwritable_output_is_one_error(tmp_path, capsys, where):
    rc, out, err = main(capsys, "unit", "--config", settings_file(tmp_path, SETTINGS), "--dflashctl", TRUE,
                        "-o", where.format(tmp=tmp_path))
    assert rc == errors.OUTPUT and out == "" and "Traceback" not in err
    assert "cannot be written" in err and err.splitlines()[-1].startswith("  fix: ")


def test_router_unit_writes_no_settings_when_the_unit_cannot_be_written(tmp_path, capsys):
    rs = tmp_path / "rs.json"
    rc, _, err = main(capsys, "router-unit", "--instance", settings_file(tmp_path, SETTINGS), "--python", TRUE,
                      "--dflashctl", TRUE, "--settings-output", rs, "-o", "/nonexistent/u")
    assert rc == errors.OUTPUT and not rs.exists() and "Traceback" not in err


@pytest.mark.parametrize("command", ["unit", "export"])
def test_a_full_disk_leaves_the_good_file_as_it_was(tmp_path, command):
    keep = tmp_path / "keep"
    keep.write_text("the good one\n")
    argv = (["unit", "--config", settings_file(tmp_path, SETTINGS), "--dflashctl", TRUE] if command == "unit"
            else ["export", "--system", "x86_64-linux", "--lock", REPO / "nix" / "python-lock.json"])
    p = run(*argv, "-o", keep, fsize=1024)
    assert p.returncode == errors.OUTPUT and "Traceback" not in p.stderr, p.stderr
    assert keep.read_text() == "the good one\n"  # was a truncated 4096-byte unit
    assert sorted(os.listdir(tmp_path)) == sorted(["keep", "s.json"] if command == "unit" else ["keep"])


# --- 3. smoke ---------------------------------------------------------------------------------------

def test_smoke_refuses_an_unwritable_result_before_it_starts(tmp_path):
    p = run("smoke", "--json", "/nonexistent/r.json", "--python", "/nonexistent/python",
            env={"TMPDIR": str(tmp_path)})
    assert p.returncode == errors.OUTPUT and "Traceback" not in p.stderr
    assert "--json /nonexistent/r.json cannot be written" in p.stderr
    assert os.listdir(tmp_path) == []  # no work dir made


def test_smoke_without_sglang_is_86_and_leaves_no_empty_work_dir(tmp_path):
    (tmp_path / "tmp").mkdir()
    p = run("smoke", "--python", "/nonexistent/python", "--json", tmp_path / "r.json",
            env={"TMPDIR": str(tmp_path / "tmp")}, cwd=tmp_path)
    assert p.returncode == errors.PREFLIGHT_SGLANG and "Traceback" not in p.stderr, p.stderr
    assert "kept" not in p.stderr and os.listdir(tmp_path / "tmp") == []
    assert json.loads((tmp_path / "r.json").read_text())["error"]["exit_code"] == errors.PREFLIGHT_SGLANG


@pytest.mark.parametrize("url", ["notaurl", "http://", "ftp://h:1", "http://h:99999"])
def test_smoke_refuses_what_is_not_a_url(capsys, url):
    rc, _, err = main(capsys, "smoke", "--url", url)
    assert rc == errors.USAGE and "is not an http(s) URL" in err and "Traceback" not in err


# --- 4. doctor's fix on another Python than the lock's: tests/host/test_probes.py ------------------------
# (test_doctor_on_another_python_than_the_locks_says_it_cannot_hold_the_stack)

# --- 5. files of several instances ------------------------------------------------------------------

MULTI = {"instances": {"a": {"model": "m", "gpus": [0]}, "b": {"model": "m", "gpus": [1], "port": 30001}}}


def test_name_selects_an_instance_of_a_multi_instance_file(tmp_path, capsys):
    multi = settings_file(tmp_path, MULTI)
    rc, out, err = main(capsys, "unit", "--config", multi, "--name", "b", "--dflashctl", TRUE)
    assert rc == 0, err
    assert "ExecStart=" in out and "/etc/dflash/b.json" in out and '"port": 30001' in err
    rc, out, _ = main(capsys, "serve", "--config", multi, "--name", "b", "--dry-run")
    assert rc == 0 and "30001" in json.loads(out)["argv"]
    rc, _, err = main(capsys, "unit", "--config", multi, "--dflashctl", TRUE)
    assert rc == errors.CONFIG and "holds 2 instances" in err and "--name" in err.splitlines()[-1]


def test_router_unit_takes_every_instance_of_a_multi_instance_file(tmp_path, capsys):
    rc, out, err = main(capsys, "router-unit", "--instance", settings_file(tmp_path, MULTI), "--python", TRUE,
                        "--dflashctl", TRUE)
    assert rc == 0, err
    assert "# Workers: http://127.0.0.1:30000 http://127.0.0.1:30001" in out


# --- 6. export of an incomplete lock ----------------------------------------------------------------

def test_export_refuses_a_lock_that_misses_a_needed_package(tmp_path, capsys):
    lock = json.loads((REPO / "nix" / "python-lock.json").read_text())
    del lock["systems"]["x86_64-linux"]["packages"]["torch"]
    path = settings_file(tmp_path, lock, "lock.json")
    rc, out, err = main(capsys, "export", "--system", "x86_64-linux", "--lock", path, "-o", tmp_path / "r.txt")
    assert rc == errors.INPUT and not (tmp_path / "r.txt").exists()
    needed_by = [n for n, w in lock["systems"]["x86_64-linux"]["packages"].items() if "torch" in w["dependencies"]]
    assert "sglang" in needed_by
    roots = lock["systems"]["x86_64-linux"]["roots"]
    assert f"torch (needed by {len(needed_by) + ('torch' in roots)}: " in err


# --- 7. --json on failure; diff's codes -------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["validate", "--json", "{bad}"], ["diff", "--json", "{bad}", "{bad}"],
    ["models", "status", "--json", "--config", "{bad}"], ["lock", "--check", "--json", "--lock", "{bad}"],
    ["doctor", "--json", "--python", "/nonexistent/python"],
], ids=["validate", "diff", "models-status", "lock-check", "doctor"])
def test_json_failures_print_one_error_object(tmp_path, capsys, argv):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    rc, out, err = main(capsys, *[a.format(bad=bad) for a in argv])
    assert rc != 0 and "Traceback" not in err
    obj = json.loads(out)
    assert obj["ok"] is False and obj["error"]["exit_code"] == rc and obj["error"]["fix"]


def test_diff_tells_unreadable_input_from_hosts_that_differ(tmp_path, capsys):
    good = json.loads((REPO / "docs" / "gpu" / "fingerprint-good.json").read_text())
    a = settings_file(tmp_path, good, "a.json")
    other = json.loads(json.dumps(good))
    other["probes"]["torch"]["facts"]["cuda"] = "12.8"
    b = settings_file(tmp_path, other, "b.json")
    assert main(capsys, "diff", a, a)[0] == errors.OK
    assert main(capsys, "diff", a, b)[0] == errors.FAILED  # the hosts differ
    assert main(capsys, "diff", a, tmp_path / "absent.json")[0] == errors.INPUT  # cannot tell


# --- 8. kernels -------------------------------------------------------------------------------------

def test_kernels_build_checks_its_arguments_before_making_out(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(capsys, "kernels", "build", "--out", out, "--arch", "foo")[0] == errors.CONFIG
    rc, _, err = main(capsys, "kernels", "build", "--out", out, "--python", "/nonexistent")
    assert rc == errors.CONFIG and "Traceback" not in err
    assert not out.exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, _, err = main(capsys, "kernels", "build", "--out", afile)
    assert rc == errors.OUTPUT and "exists and is not a directory" in err


def test_kernels_build_without_sglang_writes_no_index(tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = main(capsys, "kernels", "build", "--out", out, "--arch", "sm90", "--no-flashinfer-norm",
                      "--python", sys.executable)
    assert rc == errors.FAILED and not out.exists()
    assert "cannot import SGLang's JIT loaders" in err and "--python" in err.splitlines()[-1]


def test_kernels_status_on_a_file_suggests_nothing_that_fails(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, _, err = main(capsys, "kernels", "status", "--dir", afile)
    assert rc == errors.INPUT and "is not a directory" in err and "Traceback" not in err


# --- 9. steps printed for root ----------------------------------------------------------------------

@pytest.mark.parametrize("config_path", ["/etc/dflash/my gpu0.json", "/etc/dflash/$(touch x).json"])
def test_printed_steps_are_shell_quoted(tmp_path, capsys, config_path):
    rc, _, err = main(capsys, "unit", "--config", settings_file(tmp_path, SETTINGS), "--dflashctl", TRUE,
                      "--config-path", config_path, "-o", tmp_path / "my unit.service")
    assert rc == 0, err
    steps = err.split("(as root):\n", 1)[1].splitlines()
    assert shlex.split(steps[0])[:5] == ["install", "-D", "-m", "0644", "/dev/stdin"]
    assert shlex.split(steps[0])[5] == config_path
    install = next(s for s in steps if s.strip().startswith("install -m"))
    assert shlex.split(install)[3:] == [str(tmp_path / "my unit.service"), "/etc/systemd/system/dflash-a.service"]
    validate_step = next(s for s in steps if " validate " in s)
    assert shlex.split(validate_step)[-1] == config_path


# --- 10. the smaller ones ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["unit", "--config", "x", "--systemd", "-5"], ["doctor", "--timeout", "-1"],
                                  ["router-unit", "--systemd", "0", "--python", "/x"]])
def test_numbers_that_make_no_sense_are_refused(capsys, argv):
    rc, _, err = main(capsys, *argv)
    assert rc == errors.USAGE and err.splitlines()[-1].startswith("  fix: see `dflashctl ")


def test_help_texts_are_whole_and_say_the_exit_codes(capsys):
    for argv, must, must_not in ((["--help"], "One pinned SGLang", "parses arguments"),
                                 (["models", "--help"], "verified against the hub's file hashes.", None),
                                 (["kernels", "status", "--help"], "builds nothing", "compile the kernels"),
                                 (["diff", "--help"], "exit codes (docs/cli.md):", None)):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert must in " ".join(out.split()), (argv, out)
        assert must_not is None or must_not not in out, (argv, out)


def test_diff_with_one_file_says_so(tmp_path, capsys):
    rc, _, err = main(capsys, "diff", tmp_path / "a.json")
    assert rc == errors.USAGE and "1 file given, at least two are needed" in err and "C.json" not in err


def test_fixes_say_what_helps(tmp_path, capsys):
    """The fixes the issue found misleading: validate --python without SGLang, an oversized
    settings file, two instances on one port behind the router, a hub that cannot be reached."""
    dflash = settings_file(tmp_path, {**SETTINGS, "draftModel": "z-lab/Qwen3-8B-DFlash-b16",
                                      "speculative": {"algorithm": "DFLASH"}})
    rc, _, err = main(capsys, "validate", dflash, "--python", sys.executable)  # this venv has no SGLang
    assert rc == errors.CONFIG and "has no sglang" in err
    assert "pass --python the stack's interpreter" in err.splitlines()[-1]
    assert "correct the settings" not in err.splitlines()[-1]
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**SETTINGS, "x": "y" * (2 << 20)}))
    rc, _, err = main(capsys, "validate", big)
    assert rc == errors.CONFIG and "UTF-8" not in err.splitlines()[-1] and "far smaller" in err
    same_port = settings_file(tmp_path, {**SETTINGS, "name": "b", "gpus": [1]}, "b.json")
    rc, _, err = main(capsys, "router-unit", "--instance", settings_file(tmp_path, SETTINGS), "--instance",
                      same_port, "--python", TRUE, "--dflashctl", TRUE)
    assert rc == errors.CONFIG and "instances 'a' and 'b' both listen on http://127.0.0.1:30000" in err
    assert "without repeats" not in err
    cache = tmp_path / "hf"
    rc, _, err = main(capsys, "models", "fetch", "--config", settings_file(tmp_path, {**SETTINGS, "modelRevision":
                      "0e9e39f249a16976918f6564b8830bc894c89659"}), "--cache-dir", cache, "--endpoint",
                      "http://127.0.0.1:9")
    assert rc == errors.FAILED and "cannot be reached from here" in err.splitlines()[-1], err
    assert "check the repo id" not in err


def test_unreachable_is_told_from_a_missing_repo():
    import socket
    try:
        try:
            raise socket.gaierror(-2, "Name or service not known")
        except OSError as dns:
            raise RuntimeError("the hub client's wrapper") from dns
    except RuntimeError as e:
        assert models.unreachable(e)
    assert not models.unreachable(KeyError("repo not found"))


def test_export_outside_the_checkout_uses_the_lock_dflashctl_belongs_to(tmp_path):
    p = run("export", "--system", "x86_64-linux", "-o", tmp_path / "r.txt", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert " --hash=sha256:" in (tmp_path / "r.txt").read_text()


def test_audit_outside_the_checkout_says_so(tmp_path, capsys):
    rc, _, err = main(capsys, "audit", "--repo", tmp_path, "--wheels", tmp_path)
    assert rc == errors.INPUT and "is not the flake's checkout" in err and "no lock at" not in err


def test_readme_makes_a_venv_and_pip_leaves_no_build_dir_untracked():
    readme = (REPO / "README.md").read_text()
    assert "python3 -m venv .venv && .venv/bin/pip install -e './python[lock]'" in readme
    assert "python3 -m pip install -e" not in readme
    ignored = subprocess.run(["git", "check-ignore", "-q", "python/build/lib/dflashctl/cli.py"], cwd=REPO)
    assert ignored.returncode == 0  # `pip install ./python` builds there
