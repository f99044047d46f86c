"""README.md's pin table is nix/stack.toml's (lock/pin_table.py): generated, never stale, and
written only where its markers are."""

import shutil
import subprocess
import sys

from conftest import REPO
from dflashctl.lock import lockfile, pin_table
from dflashctl.lock import spec as specmod

README = REPO / "README.md"


def current() -> tuple[specmod.Spec, lockfile.Lock]:
    return specmod.load(REPO / "nix" / "stack.toml"), lockfile.load(REPO / "nix" / "python-lock.json")


def test_the_readme_table_is_the_specs():
    text = README.read_text()
    assert pin_table.with_table(text, *current()) == text, \
        "README.md's pin table is stale: run tests/regenerate (or python -m dflashctl.lock.pin_table README.md)"


def test_the_table_shows_the_stack_the_users_pinned():
    """Pinned by value: the versions of docs' story (sglang 0.5.11's own pins, torch's CUDA 13.0
    build), so a spec that drifts from them fails here as well as in the lock's contract."""
    table = pin_table.table(*current())
    for line in ("| sglang | 0.5.11 |", "| torch | 2.11.0, CUDA 13.0 build |", "| triton | 3.6.0 |",
                 "| sglang-kernel | 0.4.2 |", "| xgrammar | 0.1.32 |", "| flashinfer-python | 0.6.8.post1 |",
                 "| flashinfer-cubin | 0.6.8.post1 |", "| soundfile | 0.13.1 |",
                 "| cuda-toolkit[nvcc,crt,nvvm,cccl] | 13.0.2 |",
                 "| Python | 3.12, wheels for x86_64-linux, aarch64-linux up to manylinux_2_34 |"):
        assert line in table.splitlines(), line
    assert "packaging" not in table  # unpinned: resolved in the lock, not a pin
    assert "(183 wheels for x86_64-linux, 184 wheels for aarch64-linux, plus the dev shell's pytest group;" in table


def test_a_new_pin_is_a_new_row():
    spec, lock = current()
    spec = specmod.parse((REPO / "nix" / "stack.toml").read_bytes().replace(
        b'"packaging",', b'"packaging==25.0",'))
    assert "| packaging | 25.0 |" in pin_table.table(spec, lock).splitlines()


def tree(tmp_path):
    (tmp_path / "nix").mkdir()
    for name in ("stack.toml", "python-lock.json"):
        shutil.copy(REPO / "nix" / name, tmp_path / "nix" / name)
    return tmp_path


def run(readme) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflashctl.lock.pin_table", str(readme)], capture_output=True,
                          text=True, timeout=60)


def test_the_command_rewrites_the_table_in_place(tmp_path):
    readme = tree(tmp_path) / "README.md"
    stale = README.read_text().replace("| triton | 3.6.0 |", "| triton | 3.5.1 |")
    assert stale != README.read_text()
    readme.write_text(stale)
    done = run(readme)
    assert done.returncode == 0, done.stderr
    assert readme.read_text() == README.read_text()


def test_without_markers_or_a_spec_nothing_is_written_and_the_reason_named(tmp_path):
    readme = tree(tmp_path) / "README.md"
    readme.write_text("# no table\n")
    done = run(readme)
    assert done.returncode == 1 and pin_table.START in done.stderr and readme.read_text() == "# no table\n"
    readme.write_text(README.read_text().replace("| triton | 3.6.0 |", "| triton | 3.5.1 |"))
    (tmp_path / "nix" / "stack.toml").unlink()
    done = run(readme)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"pin table not written: no stack spec at {tmp_path / 'nix' / 'stack.toml'}")
    assert "| triton | 3.5.1 |" in readme.read_text()
