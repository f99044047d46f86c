"""Models pinned like the code: revisions, the hub token's one way in, offline starts, fetch.

The hub cannot be reached here: `dflashctl models fetch` runs the real hub client (huggingface_hub,
the locked version) against tests/fake_hub.py on loopback, and offline preflight reads caches laid
out here exactly as that client lays them out.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import FakeHub, Repo
from hub_cache_layout import COMMIT, DRAFT_COMMIT, lay_out
from serve_fixture import NEVER

from dflashctl import errors
from dflashctl.host import hub_cache
from dflashctl.service import config, unit, validate

REPO = Path(__file__).resolve().parent.parent.parent
TOKEN = "hf_s3cretT0ken"


def dflashctl(*args, env=None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "dflashctl", *args], capture_output=True, text=True,
                          env=env, timeout=120, **kw)


# --- settings ------------------------------------------------------------------------------------

def warnings(**settings) -> list[str]:
    return validate.warnings_for(config.from_dict({"name": "a", "model": "Qwen/Qwen3-8B", **settings}))


def test_hub_model_without_revision_or_on_a_branch_is_warned_about():
    assert any("has no modelRevision" in w for w in warnings())
    assert any("'main' is a branch or tag" in w for w in warnings(modelRevision="main"))
    assert not [w for w in warnings(modelRevision=COMMIT) if "Revision" in w]
    draft = dict(modelRevision=COMMIT, draftModel="z-lab/Qwen3-8B-DFlash-b16",
                 speculative={"algorithm": "DFLASH"})
    assert any("has no draftModelRevision" in w for w in warnings(**draft))
    assert not [w for w in warnings(**draft, draftModelRevision=DRAFT_COMMIT) if "Revision" in w]


def test_local_models_need_no_revision():
    assert not [w for w in validate.warnings_for(config.from_dict({"name": "a", "model": "/srv/models/q"}))
                if "Revision" in w]


@pytest.mark.parametrize("settings, message", [
    ({"model": "/srv/models/q", "modelRevision": COMMIT}, "is a local directory, which has no hub revision"),
    ({"model": "Qwen/Qwen3-8B", "draftModelRevision": COMMIT}, "draftModelRevision: set, but draftModel is not"),
    ({"model": "Qwen/Qwen3-8B", "modelRevision": "main branch"}, "modelRevision: must be a commit hash"),
    ({"model": "Qwen/Qwen3-8B", "modelRevision": "../../etc"}, "modelRevision: must be a commit hash"),
    ({"model": "Qwen/Qwen3-8B", "hfTokenFile": "token.txt"}, "hfTokenFile: must be an absolute path"),
    ({"model": "Qwen/Qwen3-8B", "environment": {"HF_TOKEN": "x"}}, "put the token in a file and set hfTokenFile"),
    ({"model": "Qwen/Qwen3-8B", "offline": "yes"}, "offline: must be true or false"),
])
def test_bad_model_settings_are_refused(settings, message):
    problems, _ = config.problems_of({"name": "a", **settings})
    assert any(message in p for p in problems), problems


def test_unit_hands_both_secrets_over_as_credentials():
    cfg = config.from_dict({"name": "a", "model": "m/x", "apiKeyFile": "/run/keys/api",
                            "hfTokenFile": "/run/keys/hf"})
    text = unit.render(cfg, "/etc/dflash/a.json", "/opt/dflash/bin/dflashctl", systemd=256)
    assert "LoadCredential=api-key:/run/keys/api\nLoadCredential=hf-token:/run/keys/hf\n" in text


# --- the token reaches the child's environment and nothing else ----------------------------------

def test_hf_token_reaches_only_the_childs_environment(serve, tmp_path):  # noqa: F811
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "hf-token").write_text(TOKEN + "\n")
    proc = serve("healthy", ["--skip-preflight"], settings={"hfTokenFile": "/nonexistent/hf-token"},
                 env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert proc.notify.recv_until("READY=1", proc)
    seen = json.loads((proc.tmp / "argv.json").read_text())
    assert seen["env"]["HF_TOKEN"] == TOKEN  # the child has it
    serve_cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
    settings_text = (proc.tmp / "settings.json").read_text()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == 0
    for where, text in {"argv": json.dumps(seen["argv"]), "serve's cmdline": serve_cmdline,
                        "settings": settings_text, "serve's output": out + err,
                        "SGLang's log": (proc.tmp / "sglang.log").read_text(),
                        "notify messages": "".join(proc.notify.messages)}.items():
        assert TOKEN not in text, f"the hub token leaked into {where}"
    cfg = config.from_dict(json.loads(settings_text))
    assert TOKEN not in unit.render(cfg, "/etc/dflash/t.json", "/opt/dflash/bin/dflashctl", systemd=256)


def test_an_inherited_hf_token_is_not_passed_on(serve, tmp_path):  # noqa: F811
    proc = serve("healthy", ["--skip-preflight"], env={"HF_TOKEN": "from-the-admin-shell"})
    assert proc.notify.recv_until("READY=1", proc)
    assert "HF_TOKEN" not in json.loads((proc.tmp / "argv.json").read_text())["env"]


def test_missing_hf_token_file_is_a_config_error(serve):  # noqa: F811
    proc = serve("healthy", ["--skip-preflight"], settings={"hfTokenFile": "/nonexistent/hf-token"})
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.CONFIG
    assert "cannot read the hub token /nonexistent/hf-token" in err


# --- offline: the cache as the hub client lays it out --------------------------------------------

SHARDED = {"config.json": b"{}", "model.safetensors.index.json":
           json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                      "b": "model-00002-of-00002.safetensors"}}).encode(),
           "model-00001-of-00002.safetensors": b"1" * 100, "model-00002-of-00002.safetensors": b"2" * 100}


def test_complete_cache_is_found_by_index_and_by_manifest(tmp_path):
    lay_out(tmp_path / "a", "org/m", COMMIT, SHARDED)
    found = hub_cache.inspect({"HF_HOME": str(tmp_path / "a")}, "org/m", None)
    assert (found.complete, found.commit, found.checked_by) == (True, COMMIT, "index")
    lay_out(tmp_path / "b", "org/m", COMMIT, SHARDED, ref=None, manifest=True)
    found = hub_cache.inspect({"HF_HOME": str(tmp_path / "b")}, "org/m", COMMIT)
    assert (found.complete, found.checked_by) == (True, "manifest")


def test_incomplete_caches_name_what_is_missing(tmp_path):
    home = tmp_path / "hf"
    snap = lay_out(home, "org/m", COMMIT, SHARDED)
    env = {"HF_HOME": str(home)}
    (snap / "model-00002-of-00002.safetensors").resolve().unlink()  # the blob is gone, the link stays
    assert hub_cache.inspect(env, "org/m", "main").missing == ["model-00002-of-00002.safetensors"]
    assert "refs/v2" in hub_cache.inspect(env, "org/m", "v2").missing[0]
    assert "never fetched" in hub_cache.inspect(env, "org/m", DRAFT_COMMIT).missing[0]
    m = hub_cache.manifest_path(home, "org/m", COMMIT)
    m.parent.mkdir(parents=True)
    m.write_text(json.dumps({"files": [{"path": "config.json", "size": 999}]}))  # size differs
    assert hub_cache.inspect(env, "org/m", "main").missing == ["config.json"]


def test_offline_start_is_refused_in_seconds_naming_the_gaps(serve, tmp_path):  # noqa: F811
    home = tmp_path / "hf"
    lay_out(home, "org/target", COMMIT, {"config.json": b"{}"})  # no weights
    settings = {"model": "org/target", "modelRevision": COMMIT, "draftModel": "org/draft",
                "draftModelRevision": DRAFT_COMMIT, "speculative": {"algorithm": "DFLASH"},
                "offline": True, "cacheDir": str(home)}
    proc = serve("healthy", [], settings=settings)
    _, err = proc.communicate(timeout=NEVER)
    assert proc.returncode == errors.PREFLIGHT_MODEL_MISSING
    assert f"org/target@{COMMIT}: missing *.safetensors" in err
    assert f"org/draft@{DRAFT_COMMIT}: missing snapshots/{DRAFT_COMMIT}/" in err
    assert f"dflashctl models fetch --config {proc.tmp / 'settings.json'}" in err
    assert not proc.ok_file.exists()  # SGLang was never started
    assert errors.PREFLIGHT_MODEL_MISSING in errors.NO_RESTART


def test_offline_start_with_a_complete_cache_goes_ahead_without_the_hub(serve, tmp_path):  # noqa: F811
    home = tmp_path / "hf"
    lay_out(home, "org/target", COMMIT, SHARDED)
    proc = serve("healthy", ["--skip-preflight"],
                 settings={"model": "org/target", "modelRevision": "main", "offline": True,
                           "cacheDir": str(home)})
    assert proc.notify.recv_until("READY=1", proc)
    env = json.loads((proc.tmp / "argv.json").read_text())["env"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == str(home)


# --- fetch through the real hub client against a local fake hub ----------------------------------

@pytest.fixture
def hub():
    big = bytes(range(256)) * 4096  # 1 MiB, stored with LFS
    repos = {"org/target": Repo(COMMIT, {"config.json": b'{"architectures": ["Qwen3ForCausalLM"]}',
                                         "model.safetensors": big}, lfs={"model.safetensors"},
                                branches={"main": COMMIT}),
             "org/gated": Repo(DRAFT_COMMIT, {"config.json": b"{}", "model.safetensors": b"g" * 1000},
                               lfs={"model.safetensors"}, token=TOKEN)}
    h = FakeHub(repos)
    yield h
    h.close()


def fetch(hub, tmp_path, settings: dict, *extra, env=None):
    f = tmp_path / "settings.json"
    f.write_text(json.dumps({"name": "a", **settings}))
    return dflashctl("models", "fetch", "--config", str(f), "--cache-dir", str(tmp_path / "hf"),
                     "--endpoint", hub.url, *extra, env={"HF_TOKEN": "", **(env or {})})


def test_fetch_verifies_lays_out_and_is_idempotent(hub, tmp_path):
    r = fetch(hub, tmp_path, {"model": "org/target", "modelRevision": "main", "offline": True}, "--json")
    assert r.returncode == 0, r.stderr
    assert f"-> commit {COMMIT}: 2 files, 1.0 MiB" in r.stderr.splitlines()[1]  # size said first
    assert r.stderr.count("downloaded, verified") == 2
    result = json.loads(r.stdout)["models"][0]
    assert (result["commit"], result["downloaded_bytes"]) == (COMMIT, 2**20 + len(hub.repos["org/target"].files["config.json"]))
    env = {"HF_HOME": str(tmp_path / "hf")}
    found = hub_cache.inspect(env, "org/target", "main")
    assert (found.complete, found.checked_by) == (True, "manifest")
    before = len(hub.downloads())
    again = fetch(hub, tmp_path, {"model": "org/target", "modelRevision": "main"})
    assert again.returncode == 0 and again.stderr.count("present, verified") == 2
    assert len(hub.downloads()) == before  # nothing downloaded twice


def test_fetch_resumes_a_partial_download(hub, tmp_path):
    data = hub.repos["org/target"].files["model.safetensors"]
    blobs = tmp_path / "hf" / "hub" / "models--org--target" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (hashlib.sha256(data).hexdigest() + ".incomplete")).write_bytes(data[:300000])
    r = fetch(hub, tmp_path, {"model": "org/target", "modelRevision": COMMIT})
    assert r.returncode == 0, r.stderr
    assert hub.ranges == ["bytes=300000-"]  # only the rest was asked for
    assert hub_cache.inspect({"HF_HOME": str(tmp_path / "hf")}, "org/target", COMMIT).complete


def test_fetch_refuses_a_file_that_does_not_match_the_hubs_hash(hub, tmp_path):
    hub.repos["org/target"].tampered["model.safetensors"] = b"x" * (2**20)  # same size, other bytes
    r = fetch(hub, tmp_path, {"model": "org/target", "modelRevision": COMMIT})
    assert r.returncode == errors.FAILED
    assert "org/target/model.safetensors at " + COMMIT + " does not match the hub's listing" in r.stderr
    assert "sha256" in r.stderr and "Traceback" not in r.stderr
    assert not hub_cache.manifest_path(tmp_path / "hf", "org/target", COMMIT).exists()
    assert not hub_cache.inspect({"HF_HOME": str(tmp_path / "hf")}, "org/target", COMMIT).complete


def test_gated_model_needs_the_token_file(hub, tmp_path):
    settings = {"model": "org/gated", "modelRevision": DRAFT_COMMIT}
    r = fetch(hub, tmp_path, settings)
    assert r.returncode == errors.FAILED and "needs hfTokenFile" in r.stderr
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN)
    r = fetch(hub, tmp_path, {**settings, "hfTokenFile": str(token_file)})
    assert r.returncode == 0, r.stderr
    assert all(auth == f"Bearer {TOKEN}" for m, p, auth in hub.requests[-4:])
    assert TOKEN not in r.stdout + r.stderr


def test_models_status_and_diff_show_other_weights(hub, tmp_path):
    assert fetch(hub, tmp_path, {"model": "org/target", "modelRevision": "main"}).returncode == 0
    f = tmp_path / "settings.json"
    r = dflashctl("models", "status", "--config", str(f), "--cache-dir", str(tmp_path / "hf"), "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["models"][0]["commit"] == COMMIT
    other = tmp_path / "other"
    lay_out(other, "org/target", DRAFT_COMMIT, SHARDED)
    saved = []
    for name, home in (("a", tmp_path / "hf"), ("b", other)):
        out = tmp_path / f"{name}.json"
        dflashctl("doctor", "--model", "org/target@main", "--hf-home", str(home), "--save", str(out),
                  "--timeout", "20")
        saved.append(str(out))
    r = dflashctl("diff", *saved)
    assert r.returncode == errors.FAILED
    assert "serving other weights (1)" in r.stdout
    row = next(line for line in r.stdout.splitlines() if "org/target commit" in line)
    assert COMMIT in row and DRAFT_COMMIT in row
