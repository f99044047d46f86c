"""DFLASH_UPDATE_GOLDEN=1 (conftest.update_golden): a rewrite is reported, never a pass, and CI refuses it;
tests/regenerate, the one command that rewrites goldens, finds every golden test by its `golden` marker."""

import ast

import pytest

from conftest import REPO, update_golden


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("DFLASH_UPDATE_GOLDEN", raising=False)
    update_golden(tmp_path / "g.txt", "new")
    assert not (tmp_path / "g.txt").exists()


def test_a_changed_golden_is_rewritten_and_its_test_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_UPDATE_GOLDEN", "1")
    monkeypatch.delenv("CI", raising=False)
    golden = tmp_path / "g.txt"
    golden.write_text("old")
    with pytest.raises(pytest.skip.Exception, match="review the diff"):
        update_golden(golden, "new")
    assert golden.read_text() == "new"
    update_golden(golden, "new")  # unchanged: the test goes on to its assertion


def test_ci_refuses_to_rewrite_goldens(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_UPDATE_GOLDEN", "1")
    monkeypatch.setenv("CI", "true")
    golden = tmp_path / "g.txt"
    golden.write_text("old")
    with pytest.raises(pytest.fail.Exception, match="never in CI"):
        update_golden(golden, "new")
    assert golden.read_text() == "old"


# --- tests/regenerate finds every golden by its marker ------------------------------------------------

def writes_goldens(path) -> set[str]:
    """The test functions of `path` that write a golden: they call update_golden, directly or through a
    function of the same module that does."""
    tree = ast.parse(path.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {name: {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
             for name, f in funcs.items()}
    writers = {"update_golden"}
    while grown := {n for n, called in calls.items() if called & writers} - writers:
        writers |= grown
    return {n for n in writers if n.startswith("test_")}


def marked_golden(path) -> set[str]:
    tree = ast.parse(path.read_text())
    module = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                 and "pytest.mark.golden" in ast.unparse(n.value) for n in tree.body)
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
            and (module or any("pytest.mark.golden" in ast.unparse(d) for d in n.decorator_list))}


def test_every_test_that_writes_a_golden_is_marked_golden():
    """tests/regenerate runs `-m golden`: a golden test without the marker would never be rewritten."""
    tests = [p for p in (REPO / "tests").rglob("test_*.py") if "data" not in p.relative_to(REPO / "tests").parts
             and p.name != "test_golden_updates.py"]  # this file's tests call it on files of their own
    found = {p.relative_to(REPO).as_posix(): (writes_goldens(p), marked_golden(p)) for p in tests}
    unmarked = {p: sorted(w - m) for p, (w, m) in found.items() if w - m}
    stale = {p: sorted(m - w) for p, (w, m) in found.items() if m - w}
    assert unmarked == {} and stale == {}
    assert sum(len(w) for w, _ in found.values()) >= 7  # unit, argv, unit text, doctor (2), fix-ups, nix lib


def test_the_marker_rule_sees_a_helper_that_writes(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text("import pytest\nfrom conftest import update_golden\n\ndef golden(t):\n    update_golden(P, t)\n\n"
                 "def test_a():\n    golden('x')\n\n@pytest.mark.golden\ndef test_b():\n    golden('y')\n\n"
                 "def test_c():\n    pass\n")
    assert writes_goldens(f) == {"test_a", "test_b"} and marked_golden(f) == {"test_b"}
