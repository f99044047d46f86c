"""DFLASH_UPDATE_GOLDEN=1 (conftest.update_golden): a rewrite is reported, never a pass, and CI refuses it."""

import pytest

from conftest import update_golden


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
