"""tests/leak_check.py, the check every test runs under, run on a suite of its own: a test that
leaves a process running fails, named with the process and its port, and the process is killed;
a module fixture that outlives its teardown is named; a session fixture's process is not a leak;
an orphan (its parent gone, so no longer below pytest) is found by its environment."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent

SUITE = '''
import subprocess, sys, pytest

def sleeper(tag):
    return [sys.executable, "-c", "import time, sys; time.sleep(600)", "TAG", tag]

@pytest.fixture(scope="session")
def for_the_session():
    p = subprocess.Popen(sleeper("session"))
    yield p
    p.kill()
    p.wait()

@pytest.fixture(scope="module")
def never_stopped():
    yield subprocess.Popen(sleeper("module"))

def test_clean():
    p = subprocess.Popen(sleeper("clean"))
    p.terminate()  # not waited for: it is on its way out, not a leak

def test_session_fixture(for_the_session):
    assert for_the_session.poll() is None

def test_session_fixture_again(for_the_session):
    assert for_the_session.poll() is None

def test_leaves_a_server():
    code = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, "TAG", "server"], stdout=subprocess.PIPE, text=True)
    open("server-port", "w").write(p.stdout.readline())

def test_leaves_an_orphan():
    # the shell starts the sleeper in the background and exits: the sleeper's parent is gone
    subprocess.run(["sh", "-c", sys.executable + " -c 'import time; time.sleep(600)' TAG orphan &"], check=True)

def test_module_fixture(never_stopped):
    assert never_stopped.poll() is None
'''


def tagged_alive(tag: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in argv and state != "Z":
            found.append(int(pid))
    return found


def test_a_test_that_leaves_a_process_fails_and_the_process_is_killed(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\npytest_plugins = ['leak_check']\n")
    (suite / "test_leaky.py").write_text(textwrap.dedent(SUITE).replace("TAG", f"tag-{tmp_path.name}"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", str(suite)],
                          cwd=suite, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    tag = f"tag-{tmp_path.name}"
    port = (suite / "server-port").read_text().strip()
    errors = {line.split(" - ")[0].split("::")[-1] for line in out.splitlines() if line.startswith("ERROR ")}
    assert errors == {"test_leaves_a_server", "test_leaves_an_orphan", "test_module_fixture"}, out
    assert "test_leaky.py::test_leaves_a_server leaked processes (killed now)" in out
    assert "still running: pid " in out and f"{tag} server` (listening on 127.0.0.1:{port})" in out
    assert f"{tag} orphan" in out
    assert "fixture 'never_stopped' (module) left running: pid" in out and f"{tag} module" in out
    for passed in ("test_clean", "test_session_fixture", "test_session_fixture_again"):
        assert f"PASSED test_leaky.py::{passed}" in out, out
    assert tagged_alive(tag) == []  # every leftover was killed, the session's own process stopped by its fixture
