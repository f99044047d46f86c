"""Issue 42's "causes named wrong": each day-2 command names the real cause of a fault and the fix
that helps, one regression test each. The codes alone are held by the contract corpus
(tests/data/cli/contract.json, rows' `exit` and `good`); here what the messages say. Ctrl-C and
SIGTERM with --json: tests/cli/test_cli_interrupts.py; the router's interpreter:
tests/operations/test_router.py."""

import json
import re
from pathlib import Path

from dflashctl import cli, errors
from model_pair_files import cached_pair, hub_settings

SETTINGS = {"name": "a", "model": "Qwen/Qwen3-8B", "gpus": [0],
            "modelRevision": "0e9e39f249a16976918f6564b8830bc894c89659"}


def main(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


# --- serve: a wrong interpreter is a settings error, not a driver fault ------------------------------

def test_serve_with_a_missing_python_names_the_option_not_the_driver(tmp_path, capsys):
    """Was exit 85, "driver: NVML failed", fix "install NVIDIA driver >= 580": 85 is never restarted,
    so the unit stayed down for a reason that was not the cause."""
    cfg = write(tmp_path / "a.json", {**SETTINGS, "cacheDir": str(tmp_path / "cache")})
    rc, out, err = main(capsys, "serve", "--config", cfg, "--python", "/nonexistent/python")
    assert rc == errors.CONFIG and out == "" and "Traceback" not in err
    assert "--python /nonexistent/python cannot run the stack: /nonexistent/python does not exist" in err
    assert "NVML" not in err and "driver" not in err
    fix = err.splitlines()[-1]
    assert fix.startswith("  fix: pass --python the stack's interpreter") and "dflashctl unit --python" in fix


def test_serve_with_an_interpreter_that_is_not_python_says_so(tmp_path, capsys):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    cfg = write(tmp_path / "a.json", {**SETTINGS, "cacheDir": str(tmp_path / "cache")})
    rc, _, err = main(capsys, "serve", "--config", cfg, "--python", fake)
    assert rc == errors.CONFIG and f"{fake} is not a Python 3 interpreter" in err


def test_serve_launcher_with_unbalanced_quotes_is_a_clear_usage_error(tmp_path, capsys):
    cfg = write(tmp_path / "a.json", SETTINGS)
    rc, out, err = main(capsys, "serve", "--config", cfg, "--launcher", '"unbalanced', "--dry-run")
    assert rc == errors.USAGE and out == "" and "Traceback" not in err
    assert "--launcher '\"unbalanced' cannot be split into words: No closing quotation" in err
    assert err.splitlines()[-1].startswith("  fix: give --launcher a command line with balanced quotes")


# --- doctor --expect-gpus: fewer GPUs seen fails ------------------------------------------------------

def test_doctor_expecting_gpus_fails_when_none_is_seen(tmp_path, capsys, monkeypatch):
    """NVML does not answer (here: driver discovery pointed at an empty directory, on any host): with
    --expect-gpus the `gpus` warning is joined by a failing `gpu-count`; without it, only the warning."""
    empty = tmp_path / "no-driver"
    empty.mkdir()
    monkeypatch.setenv("DFLASH_DRIVER_LIBRARY_DIR", str(empty))
    monkeypatch.delenv("DFLASHCTL_NVML_REPLAY", raising=False)
    rc, out, _ = main(capsys, "doctor", "--expect-gpus", "2", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert rc == errors.FAILED
    count = checks["gpu-count"]
    assert count["status"] == "fail" and count["summary"].startswith("--expect-gpus 2, but no GPU is seen")
    assert checks["gpus"]["status"] == "warn"
    rc, out, _ = main(capsys, "doctor", "--json")
    assert "gpu-count" not in {c["name"] for c in json.loads(out)["checks"]}


# --- validate --models: what it could not check is not "valid" ------------------------------------------

def test_validate_models_names_the_models_it_could_not_read(tmp_path, capsys):
    cfg = write(tmp_path / "a.json", {**SETTINGS, "cacheDir": str(tmp_path / "cache")})
    rc, out, err = main(capsys, "validate", cfg, "--models")
    assert rc == errors.PREFLIGHT_MODEL_MISSING and "valid" not in out
    assert "the models could not be checked" in err
    assert f"instance 'a': Qwen/Qwen3-8B@{SETTINGS['modelRevision']} is not in its cache ({tmp_path / 'cache'})" in err
    assert err.splitlines()[-1].startswith(f"  fix: dflashctl models fetch --config {cfg}")
    rc, out, err = main(capsys, "validate", cfg, "--models", "--json")
    obj = json.loads(out)
    assert rc == errors.PREFLIGHT_MODEL_MISSING and obj["ok"] is False and len(obj["unchecked"]) == 1
    rc, out, err = main(capsys, "validate", cfg, "--models", "--skip-unfetched")
    assert rc == errors.OK and "1 instance(s) valid (1 model(s) not in the cache, not checked): a" in out
    assert "not checked (--skip-unfetched)" in err


def test_validate_models_with_the_pair_in_the_cache_says_they_were_checked(tmp_path, capsys):
    cached_pair(tmp_path / "hf")
    cfg = write(tmp_path / "q.json", hub_settings(tmp_path / "hf", offline=False))
    rc, out, err = main(capsys, "validate", cfg, "--models")
    assert rc == errors.OK, err
    assert out == f"{cfg}: 1 instance(s) valid (models checked): q\n"


# --- models fetch: nothing to fetch is success ----------------------------------------------------------

def test_models_fetch_with_only_local_models_succeeds(tmp_path, capsys):
    cfg = write(tmp_path / "l.json", {"name": "l", "model": str(tmp_path / "qwen")})
    rc, out, err = main(capsys, "models", "fetch", "--config", cfg, "--cache-dir", tmp_path / "hf", "--json")
    assert rc == errors.OK and json.loads(out) == {"ok": True, "models": []}
    assert "nothing to fetch: every model in the settings is a local directory" in err
    assert not (tmp_path / "hf").exists()


# --- validate router.json: router settings by the router's rules ---------------------------------------

def test_validate_reads_router_settings_as_router_settings(tmp_path, capsys):
    """Was 20 'unknown setting' errors: each router key held to the instance schema."""
    good = write(tmp_path / "router.json", {"workers": ["http://127.0.0.1:30000", "http://127.0.0.1:30001"],
                                            "instanceUnits": ["dflash-a.service", "dflash-b.service"],
                                            "port": 30080, "drainSec": 30, "policy": "cache_aware"})
    rc, out, err = main(capsys, "validate", good)
    assert rc == errors.OK and "unknown setting" not in err, err
    assert out == f"{good}: router settings valid: http://127.0.0.1:30080 in front of 2 worker(s)\n"
    bad = write(tmp_path / "bad.json", {"workers": ["http://127.0.0.1:30000"], "drainSec": -1, "polcy": "x"})
    rc, out, err = main(capsys, "validate", bad, "--json")
    obj = json.loads(out)
    assert rc == errors.CONFIG and obj["ok"] is False
    assert any(e.startswith("drainSec:") for e in obj["errors"]) and any("polcy" in e for e in obj["errors"])
    assert len(obj["errors"]) == 2, obj["errors"]  # no "unknown setting" for the keys the router has


# --- the docs a newcomer follows --------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.json"))


def test_the_readmes_example_settings_are_valid_and_named(capsys):
    """README uses gpu0.json throughout: the example files exist, README names each, each
    validates, and the router section's two instances fit behind one router."""
    readme = (REPO / "README.md").read_text()
    assert {p.name for p in EXAMPLES} >= {"gpu0.json", "gpu1.json"}
    for path in EXAMPLES:
        assert f"docs/examples/{path.name}" in readme, path.name
        rc, out, err = main(capsys, "validate", path)
        assert rc == errors.OK and "valid" in out, err
    rc, out, err = main(capsys, "router-unit", *[a for p in EXAMPLES for a in ("--instance", p)],
                        "--python", "/usr/bin/env", "--dflashctl", "/usr/bin/env")
    assert rc == errors.OK, err
    assert "# Workers: http://127.0.0.1:30000 http://127.0.0.1:30001" in out


def test_test_files_the_docs_tell_to_run_exist():
    """docs/service.md named test_systemd.py after it had moved to tests/service/."""
    named = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for command in re.findall(r"`([^`\n]*pytest[^`\n]*)`", doc.read_text()):
            named += [(doc.name, w) for w in command.split() if w.endswith(".py")]
    assert named, "no pytest command found in the docs: the pattern is stale"
    missing = [(doc, w) for doc, w in named if not (REPO / "tests" / w).is_file()]
    assert not missing, f"docs name test files that do not exist (relative to tests/): {missing}"


def test_readme_says_what_models_fetch_and_the_pip_path_need():
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "`huggingface_hub` only for `dflashctl models fetch`" in readme
    assert "Debian 12 ships 3.11 only" in readme and "uv python install 3.12" in readme
    assert "about 5 s" not in readme and "66 s cold" in readme
