"""`dflashctl export`: a --require-hashes requirements file from the lock (offline)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lockfixtures import build

from dflashctl import errors
from dflashctl.errors import DflashError
from dflashctl.lock.export import requirements_text

REPO = Path(__file__).resolve().parent.parent.parent
LINE = re.compile(r"^([a-z0-9-]+)==(\S+) --hash=sha256:([0-9a-f]{64})$")


def dflashctl(*args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    return subprocess.run([sys.executable, "-m", "dflashctl", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


@pytest.mark.parametrize("system", ["x86_64-linux", "aarch64-linux"])
def test_one_hashed_line_per_locked_wheel(system):
    lock = build()
    lines = [ln for ln in requirements_text(lock, system).splitlines() if not ln.startswith("#")]
    parsed = [LINE.match(ln) for ln in lines]
    assert all(parsed), [ln for ln, m in zip(lines, parsed) if not m]
    assert [(m[1], m[2], m[3]) for m in parsed] == [
        (w.name, w.version, w.sha256) for _, w in sorted(lock.packages(system).items())]
    # The dev group (pytest and what only it needs) is the dev shell's, not a host's.
    assert {"pytest", "pluggy", "iniconfig"} <= set(lock.systems[system])
    assert not {"pytest", "pluggy", "iniconfig"} & {m[1] for m in parsed}


def test_gpu_payload_reads_the_pins():
    # /work/shared/tools/gpu-payload keeps `name==version` and ignores the rest of each line.
    text = requirements_text(build(), "x86_64-linux")
    pins = [m[0] for ln in text.splitlines()
            if (m := re.match(r"\s*([A-Za-z0-9_.\-]+)==([^\s;\\]+)", ln))]
    assert "torch==2.11.0" in pins and "xgrammar==0.1.32" in pins
    assert len(pins) == len(build().packages("x86_64-linux"))


def test_systems_differ_where_the_wheels_differ():
    lock = build()
    x86, arm = (requirements_text(lock, s) for s in ("x86_64-linux", "aarch64-linux"))
    torch_hash = lambda text: re.search(r"^torch==.*$", text, re.M)[0]  # noqa: E731
    assert torch_hash(x86) != torch_hash(arm)


def test_unknown_system_is_refused():
    with pytest.raises(DflashError, match="unknown system 'riscv64-linux'"):
        requirements_text(build(), "riscv64-linux")


def test_cli_writes_file_and_fails_cleanly(tmp_path):
    lock_path = tmp_path / "lock.json"
    lock_path.write_text(build().dumps())
    out = tmp_path / "req.txt"
    ok = dflashctl("export", "--system", "aarch64-linux", "--lock", str(lock_path), "-o", str(out))
    assert ok.returncode == 0, ok.stderr
    assert out.read_text() == requirements_text(build(), "aarch64-linux")

    bad = dflashctl("export", "--system", "riscv64-linux", "--lock", str(lock_path))
    assert bad.returncode == errors.USAGE and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("dflashctl export: argument --system: invalid choice: 'riscv64-linux'")

    missing = dflashctl("export", "--system", "x86_64-linux", "--lock", str(tmp_path / "nope.json"))
    assert missing.returncode == errors.INPUT and "no lock at" in missing.stderr
