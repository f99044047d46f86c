"""`dflashctl upgrade` on one host (loopback), and deploy/ansible's role through ansible-lint.

The host is tests/fleet_host.py's, in-process: instances under the real supervisor, started on the
build `<root>/current` names, the real router; builds are real venvs made by pip --require-hashes
from tests/fleet_harness.py's stand-in wheels. The fleet itself (three hosts, ansible-playbook) is
tests/operations/test_fleet.py.
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from dflashctl.errors import FAILED, DflashError
from dflashctl.operations import upgrade, upgrade_build
from conftest import nix_or_skip
from fleet_harness import REPO, stack_wheel
from nixeval import NIX_CONFIG
from fleet_host import START
from rollout_harness import QUICK_CANARY, Supervisor
from router_harness import ENV, Router, free_port, needs_router

ANSIBLE = REPO / "deploy" / "ansible"
BIN = Path(sys.executable).parent
PY = sys._base_executable


def reqs(tmp: Path, tag: str, behaviour: dict | None = None) -> Path:
    _, line = stack_wheel(tmp / "wheels", tag, behaviour or {})
    path = tmp / f"req-{tag}.txt"
    path.write_text(line)
    return path


@pytest.fixture
def pip_env(tmp_path, monkeypatch):
    for k, v in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "wheels"), "PIP_NO_CACHE_DIR": "1",
                 "PIP_DISABLE_PIP_VERSION_CHECK": "1"}.items():
        monkeypatch.setenv(k, v)
    return dict(ENV, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "wheels"), PIP_NO_CACHE_DIR="1")




@pytest.fixture
def host(tmp_path, pip_env):
    """Two instances on build v1 behind the router."""
    root = tmp_path / "opt"
    build = upgrade_build.pip_build(root, str(reqs(tmp_path, "v1")), None, PY)
    upgrade_build.point_current(root, build.id)
    sup, files = Supervisor(tmp_path), []
    for i in range(2):
        f = tmp_path / f"gpu{i}.json"
        f.write_text(json.dumps({"name": f"gpu{i}", "model": "standin-model", "port": free_port(55535),
                                 "environment": {"STANDIN_READY_AFTER": "0.5"}}))
        files.append(f)
        sup.add(f"gpu{i}", ["/bin/sh", "-c", START, sys.executable, str(f), str(root / "current")],
                dict(ENV, LOGS_DIRECTORY=str(tmp_path)))  # serve's SGLang log: this test's own
    sup.serve_control().start_all()
    urls = [f"http://127.0.0.1:{json.loads(f.read_text())['port']}" for f in files]
    router = Router({"workers": urls}, tmp_path).start()
    router.wait_healthy(urls)
    (tmp_path / "router-settings.json").write_text(json.dumps(router.settings))

    def run(requirements: Path, *extra: str) -> tuple[int, dict, str]:
        argv = [str(BIN / "dflashctl"), "upgrade", "--json", "--root", str(root), "--requirements", str(requirements),
                "--python", PY, "--state-dir", str(tmp_path / "state"), "--restart-command", sup.restart_command,
                "--router", str(tmp_path / "router-settings.json"), *[f"--instance={f}" for f in files],
                "--", "--healthy-for", "0.5", *QUICK_CANARY, *extra]
        r = subprocess.run(argv, env=pip_env, capture_output=True, text=True, timeout=600)
        return r.returncode, json.loads(r.stdout), r.stderr

    h = type("Host", (), {"root": root, "sup": sup, "first": build, "run": staticmethod(run), "router": router, "files": files,
                          "starts": lambda: {n: i.starts for n, i in sup.instances.items()}})
    yield h
    router.stop()
    sup.shutdown()


@needs_router
@pytest.mark.slow
def test_upgrade_rolls_every_instance_onto_the_new_build_once(host, tmp_path):
    rc, out, err = host.run(reqs(tmp_path, "v2"))
    assert rc == 0, err
    assert out["ok"] and out["changed"] and out["build"]["installed"], out
    assert upgrade_build.current(host.root) == out["build"]["id"] != out["previous_build"]
    assert host.starts() == {"gpu0": 2, "gpu1": 2}
    assert [s["outcome"] for s in out["rollout"]["instances"]] == ["done", "done"]
    rc, again, err = host.run(reqs(tmp_path, "v2"))  # the same build and settings: nothing to do
    assert rc == 0 and not again["changed"] and not again["build"]["installed"], (again, err)
    assert host.starts() == {"gpu0": 2, "gpu1": 2} and again["rollout"] is None


@needs_router
@pytest.mark.slow
def test_a_build_that_does_not_install_restarts_nothing(host, tmp_path):
    bad = tmp_path / "req-tampered.txt"
    bad.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, reqs(tmp_path, "v3").read_text()))
    before = upgrade_build.current(host.root)
    rc, out, err = host.run(bad)
    assert rc == FAILED, err
    assert not out["ok"] and "pip install --require-hashes failed" in out["error"]["what"], out
    assert "nothing was restarted" in out["error"]["what"] and "fix:" in err
    assert host.starts() == {"gpu0": 1, "gpu1": 1} and upgrade_build.current(host.root) == before


@needs_router
@pytest.mark.slow
def test_a_stopped_rollout_points_current_back_at_the_build_still_serving(host, tmp_path):
    before = upgrade_build.current(host.root)
    rc, out, err = host.run(reqs(tmp_path, "bad", {"STANDIN_DIVERGE_FROM": "3"}))  # the canary stops it
    assert rc == 7, err
    assert upgrade_build.current(host.root) == before  # a crash of gpu1 now restarts the old build
    assert out["summary"].startswith(f"{upgrade.socket.gethostname()}: upgrade to build {out['build']['id']} "
                                     "stopped at instance gpu0"), out["summary"]
    assert "canary: failed" in out["summary"] and "outputs differs" in out["summary"]
    # reverted: gpu0 restarted on the build still serving, its canary passed, back in the router
    assert out["reverted"] == {"instances": ["gpu0"], "ok": True, "exit_code": 0, "left_out": []}, out["reverted"]
    assert "reverted gpu0 to the build still serving" in out["summary"]
    assert host.starts() == {"gpu0": 3, "gpu1": 1}
    assert host.router.workers() == {u: True for u in host.router.settings["workers"]}


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs /usr/bin/python3: a unit may not run "
                    "an interpreter under /root or /home (this test's own is)")
@needs_router
@pytest.mark.slow
def test_a_restart_that_does_not_start_the_new_build_is_caught(host, tmp_path):
    """A supervisor that starts a fixed build, not `current`: the rollout restarts every instance and
    passes its canary, but /server_info still names the old SGLang: not proven, exit 1."""
    for i, f in enumerate(host.files):
        host.sup.define(f"gpu{i}", ["/bin/sh", "-c", START, sys.executable, str(f), str(host.first.path)])
    rc, out, err = host.run(reqs(tmp_path, "v2"))
    assert rc == FAILED, err
    assert host.starts() == {"gpu0": 2, "gpu1": 2}  # restarted, onto the old build
    assert "not every instance runs it" in out["summary"], out["summary"]
    assert "gpu0 (serves 0.5.11+v1, the build has 0.5.11+v2)" in out["summary"], out["summary"]
    assert upgrade_build.current(host.root) == host.first.id  # current back where the instances are


@pytest.fixture
def unit_visible_dir():
    """A directory a unit's sandbox can see: the renderer refuses a build under /tmp, /home or /root
    (PrivateTmp, ProtectHome), wherever the test's own temporary directory happens to be."""
    base = Path("/var/lib/dflash-tests")
    try:
        base.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(dir=base))
    except OSError as e:
        pytest.skip(f"needs a writable directory outside /tmp, /home and /root ({base}: {e.strerror})")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_units_for_a_new_build_name_it_and_are_put_back(tmp_path, pip_env, unit_visible_dir):
    """Under systemd the units change with the build (so the rollout sees them out of date) and a
    stopped rollout gets the old ones back."""
    build = upgrade_build.pip_build(unit_visible_dir / "opt", str(reqs(tmp_path, "v1")), None, "/usr/bin/python3")
    # The glue in the build, as --glue installs it: dflashctl importable from the build's interpreter.
    site = next((build.path / "lib").glob("python3*/site-packages"))
    (site / "dflashctl-source.pth").write_text(str(REPO / "python") + "\n")
    exe = build.path / "bin" / "dflashctl"
    exe.write_text(f"#!{build.python}\nimport sys\nfrom dflashctl.cli import main\nsys.exit(main())\n")
    exe.chmod(0o755)
    f = unit_visible_dir / "etc" / "gpu0.json"
    f.parent.mkdir()
    f.write_text(json.dumps({"name": "gpu0", "model": "standin-model", "port": 30000}))
    units = unit_visible_dir / "units"
    units.mkdir()
    (units / "dflash-gpu0.service").write_text("the old unit\n")
    before = upgrade.write_units(build, [str(f)], units)
    text = (units / "dflash-gpu0.service").read_text()
    assert f"{exe} serve" in text and f"--python {build.python}" in text, text
    assert "DFLASH_UNIT_DIGEST=" in text
    upgrade.restore_units(before)
    assert (units / "dflash-gpu0.service").read_text() == "the old unit\n"


STACK_FLAKE = """{
  outputs = { self }: {
    packages.x86_64-linux.stack = builtins.derivation {
      name = "stand-in-stack-TAG";
      system = "x86_64-linux";
      builder = "/bin/sh";
      args = [ "-c" "/bin/mkdir -p $out/bin $out/lib/python3.12/site-packages/sglang-0.5.11+TAG.dist-info && /bin/ln -s PY $out/bin/python" ];
    };
  };
}
"""


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="the stand-in flake names x86_64-linux")
def test_a_nix_build_is_a_profile_per_build_made_once(tmp_path, monkeypatch):
    """--nix: `nix build --json` then `nix profile install` into builds/<store hash>; the same installable
    again installs nothing; one that does not evaluate is a failed install naming Nix's message."""
    nix_or_skip()
    monkeypatch.setenv("NIX_CONFIG", NIX_CONFIG)
    flake = tmp_path / "flake"
    flake.mkdir()
    (flake / "flake.nix").write_text(STACK_FLAKE.replace("TAG", "n1").replace("PY", PY))
    root = tmp_path / "opt"
    build = upgrade_build.nix_build(root, f"path:{flake}#stack")
    assert build.installed and build.how == "nix" and (build.path / "bin" / "python").exists()
    marker = json.loads(build.path.with_name(build.path.name + upgrade_build.MARKER).read_text())
    assert Path(marker["store_path"]).name.startswith(build.id + "-stand-in-stack-n1"), marker
    assert (build.path / "bin" / "python").resolve() == Path(PY).resolve() and build.sglang_version() == "0.5.11+n1"
    again = upgrade_build.nix_build(root, f"path:{flake}#stack")
    assert (again.id, again.installed) == (build.id, False)
    with pytest.raises(DflashError) as e:
        upgrade_build.nix_build(root, f"path:{flake}#nothing")
    assert e.value.exit_code == FAILED and "nix build" in e.value.what and "nothing" in e.value.why


def test_the_role_passes_ansible_lint_and_the_lint_sees_a_bad_task(tmp_path):
    lint = BIN / "ansible-lint"
    if not lint.exists():
        pytest.skip("ansible-lint is not installed (pip install -e 'python[test]'; tests/run does)")
    env = dict(ENV, HOME=str(tmp_path), ANSIBLE_HOME=str(tmp_path / "ansible"), NO_COLOR="1")
    r = subprocess.run([str(lint), "--offline", "playbook.yml", "monitoring.yml", "roles/dflash"], cwd=ANSIBLE, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    copy = tmp_path / "broken"
    shutil.copytree(ANSIBLE, copy)
    tasks = copy / "roles" / "dflash" / "tasks" / "main.yml"
    tasks.write_text(tasks.read_text() + "\n- command: echo not named, not idempotent\n")
    r = subprocess.run([str(lint), "--offline", "playbook.yml", "monitoring.yml", "roles/dflash"], cwd=copy, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "name[missing]" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_example_inventory_holds_settings_dflashctl_validates(tmp_path):
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with ansible-core (python[test])")
    inventory = yaml.safe_load((ANSIBLE / "inventory.example.yml").read_text())
    instances = inventory["dflash"]["vars"]["dflash_instances"]
    f = tmp_path / "instances.json"
    f.write_text(json.dumps({"instances": instances}))
    r = subprocess.run([str(BIN / "dflashctl"), "validate", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "2 instance(s) valid" in r.stdout + r.stderr, r.stdout + r.stderr


@needs_router
def test_a_host_whose_router_lists_a_remote_worker_that_is_down_still_upgrades(host, tmp_path):
    remote = f"http://127.0.0.1:{free_port(55535)}"  # another host's instance, down while that host rolls
    host.router.sync(workers=list(host.router.settings["workers"]) + [remote])
    (tmp_path / "router-settings.json").write_text(json.dumps(host.router.settings))
    rc, out, err = host.run(reqs(tmp_path, "v2"))
    assert rc == 0, err
    assert "waiting for " + remote not in err
