"""Adding a setting, an XID verdict or a pin touches the files docs/INTERNALS.md says it does.

Each test makes the change on a copy of the tree (its tracked and new files, committed into a fresh
git repository), runs `tests/regenerate` there as a developer would, and compares what `git status`
shows with the recipe's "Touches:" line: the files changed by hand plus those the command rewrote,
no more, no fewer. The copy then passes the tests that hold its generated files to their data, and
the code there acts on the change. The goldens are regenerated under the folder whose goldens can
read the change (tests/service for a setting); a pin's new lock needs the package index
(`dflashctl lock`), so the copy shows instead that the lock it has no longer matches the spec.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, nix_or_skip
from nixeval import eval_expr

INTERNALS = REPO / "docs" / "INTERNALS.md"
pytestmark = pytest.mark.slow
GIT = ["git", "-c", "user.name=recipe test", "-c", "user.email=recipe@test.invalid", "-c", "commit.gpgsign=false"]


def touches(recipe: str) -> dict[str, set[str]]:
    """The "Touches:" line after `recipe` in docs/INTERNALS.md: {"by hand": paths, "<command>": paths}."""
    text = INTERNALS.read_text()
    start = text.index("Touches:", text.index(recipe))
    line = " ".join(text[start:text.index(".\n", start)].split())
    groups = {}
    for part in line[len("Touches:"):].split(";"):
        kind = "by hand" if part.strip().startswith("by hand") else re.match(r"\s*`([^`]+)` rewrites", part)[1]
        groups[kind] = {p for p in re.findall(r"`([^`]+)`", part) if p != kind}
    return groups


def copy_tree(dest: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        src, dst = REPO / name, dest / name
        if not src.exists():  # deleted in the work tree, not yet in the index
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    subprocess.run([*GIT, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "the tree before the change"], cwd=dest, check=True)
    return dest


def env_for(tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DFLASH_UPDATE_GOLDEN", "PYTHONPATH")}
    # a throw-away copy may be regenerated anywhere (the CI refusal guards the real tree); the
    # copy's own package, and the goldens that need no network
    return {**env, "DFLASH_PYTHON": sys.executable, "DFLASH_OFFLINE": "1", "PYTHONPATH": str(tree / "python")}


def regenerate(tree: Path, *paths: str) -> None:
    done = subprocess.run([str(tree / "tests" / "regenerate"), *paths], cwd=tree, env=env_for(tree),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def changed(tree: Path) -> set[str]:
    out = subprocess.run([*GIT, "status", "--porcelain", "-uall"], cwd=tree, check=True, capture_output=True,
                         text=True).stdout
    return {line[3:] for line in out.splitlines()}


def pytest_in(tree: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=tree / "tests", env=env_for(tree), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def python_in(tree: Path, code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env=env_for(tree), check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def test_the_recipes_say_what_they_touch():
    assert touches("**A setting of an instance**")["by hand"] == {"python/dflashctl/service/data/settings.json"}
    assert touches("*An XID verdict*")["by hand"] == {"python/dflashctl/host/data/gpu-health.json"}
    pin = touches("**A pin**")
    assert (pin["by hand"], pin["dflashctl lock"]) == ({"nix/stack.toml"}, {"nix/python-lock.json"})
    for recipe in ("**A setting of an instance**", "*An XID verdict*", "**A pin**"):
        for paths in touches(recipe).values():
            assert all((REPO / p).is_file() for p in paths), (recipe, paths)


def test_a_setting(tmp_path):
    tree = copy_tree(tmp_path)
    schema = tree / "python/dflashctl/service/data/settings.json"
    data = json.loads(schema.read_text())
    data["settings"].append({"key": "enableThrowaway", "type": "bool", "default": False,
                             "description": "A switch (`--enable-throwaway`).",
                             "sglang": {"flag": "--enable-throwaway", "map": "switch"}, "summary": "a switch"})
    schema.write_text(json.dumps(data, indent=2) + "\n")
    regenerate(tree, "tests/service")
    said = touches("**A setting of an instance**")
    assert changed(tree) == said["by hand"] | said["tests/regenerate"]
    numstat = subprocess.run([*GIT, "diff", "--numstat", "--", "tests/data/service/units"], cwd=tree, check=True,
                             capture_output=True, text=True).stdout.splitlines()
    assert len(numstat) == 4 and all(line.startswith("1\t1\t") for line in numstat), numstat  # the digest line
    pytest_in(tree, "service/test_settings_schema.py::test_docs_table_is_the_schemas",
              "service/test_config.py::test_the_settings_file_holds_every_key_and_reads_back")
    assert "| `enableThrowaway` | false | `--enable-throwaway` when true | a switch |" in \
        (tree / "docs/service.md").read_text()


def test_an_xid_verdict(tmp_path):
    tree = copy_tree(tmp_path)
    path = tree / "python/dflashctl/host/data/gpu-health.json"
    data = json.loads(path.read_text())
    data["xids"].append({"xid": 140, "verdict": "fail", "what": "a throw-away failure", "fix": "{reset}",
                         "reason": "a test's: NVIDIA's device plugin counts it fatal too"})
    data["xids"].sort(key=lambda x: x["xid"])
    path.write_text(json.dumps(data, indent=2) + "\n")
    regenerate(tree, "tests/operations/test_gpu_alerts.py")  # no golden reads the health data
    said = touches("*An XID verdict*")
    assert changed(tree) == said["by hand"] | said["tests/regenerate"]
    pytest_in(tree, "host/test_gpu_health_data.py::test_the_docs_tables_are_the_datas",
              "operations/test_gpu_alerts.py::test_the_rule_file_holds_the_generated_gpu_alerts",
              "operations/test_gpu_alerts.py::test_every_gpu_alert_follows_the_health_data")
    assert python_in(tree, "from dflashctl.host import gpu_health as g; f = g.xid_finding(140, 0); "
                           "print(f.status, f.what)") == "fail XID 140: a throw-away failure"
    rules = (tree / "python/dflashctl/operations/data/monitoring/dflash.rules.json").read_text()
    assert "DCGM_FI_DEV_XID_ERRORS == 140" in rules and "|140|154" in rules
    assert "| 140 | fail (exit 94) | a throw-away failure |" in (tree / "docs/service.md").read_text()


@pytest.fixture(scope="module")
def pinned(tmp_path_factory) -> Path:
    """A copy of the tree with one more pin: packaging at the version the lock holds."""
    tree = copy_tree(tmp_path_factory.mktemp("pinned"))
    spec = tree / "nix/stack.toml"
    version = json.loads((tree / "nix/python-lock.json").read_text())["systems"]["x86_64-linux"]["packages"][
        "packaging"]["version"]
    text = spec.read_text()
    assert '"packaging",' in text
    spec.write_text(text.replace('"packaging",', f'"packaging=={version}",'))
    regenerate(tree, "tests/lock")  # no golden under tests/lock: the generated files only
    return tree


def test_a_pin(pinned):
    said = touches("**A pin**")
    # The lock, and the goldens evaluated over it, follow `dflashctl lock`; the copy cannot ask the index.
    over_the_lock = {p for p in said["tests/regenerate"] if p.startswith("tests/nix/expected/")
                     and "nix/python-lock.json" in (REPO / "tests/nix" / Path(p).with_suffix(".nix").name).read_text()}
    assert over_the_lock == {"tests/nix/expected/real-lock.json"}
    assert changed(pinned) == said["by hand"] | (said["tests/regenerate"] - over_the_lock)
    version = python_in(pinned, "from dflashctl.lock import spec; print([r for r in spec.load('nix/stack.toml')"
                                ".requirements if r.startswith('packaging')][0].split('==')[1])")
    assert f"| packaging | {version} |" in (pinned / "README.md").read_text()
    pytest_in(pinned, "lock/test_pin_table.py::test_the_readme_table_is_the_specs")
    # the lock was made from the old spec: every reader of the spec hash says so
    stale = python_in(pinned, "from dflashctl.lock import lockfile, spec; "
                              "print(spec.load('nix/stack.toml').sha256 != lockfile.load('nix/python-lock.json').spec_sha256)")
    assert stale == "True"


def test_after_a_pin_the_flake_check_names_the_lock_to_rewrite(pinned):
    """nix/lib/spec.nix is what the flake's lock-matches-spec check evaluates."""
    check = eval_expr(nix_or_skip(), f"(import {pinned}/nix/lib/spec.nix).check "
                                     f"{{ lockFile = {pinned}/nix/python-lock.json; specFile = {pinned}/nix/stack.toml; }}")
    assert check["ok"] is False and "run `dflashctl lock` and commit both files" in check["message"]
