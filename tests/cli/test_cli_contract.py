"""Every command keeps its contract on bad input (docs/cli.md), over the corpus in
tests/data/cli/contract.json: each row a command, each case one bad input.

For every case: the exit code is in the command's row of exit_codes.py (and not 0); no "Traceback"
in stdout or stderr; the last lines of stderr name what failed (`dflashctl CMD: ...`) and a fix
(`  fix: ...`); no file in the test's world is created, changed or removed (a row may name an
output a failure writes on purpose: smoke's --json result); no network connection is attempted;
with --json, stdout is exactly one JSON object, the error with the exit code in it. A case the
corpus names in its row's `exit` must end with that very code (the cause named right); a row's
`good` cases must succeed under the same watch (no traceback, no network, nothing written outside
the output directory). The corpus is
run in-process through dflashctl.cli.main (milliseconds a case); a sample runs as a subprocess too,
to prove the two agree, and the full-file-system cases (RLIMIT_FSIZE) run only that way.
"""

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl import cli, errors, exit_codes

HERE = Path(__file__).parent.parent
REPO = HERE.parent
CORPUS = json.loads((HERE / "data" / "cli" / "contract.json").read_text())["rows"]
MIN_CASES = 40
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

# --- the bad things, by kind ------------------------------------------------------------------------

# Files every reader must refuse, whatever it reads (name -> how the test makes it).
FILE_BAD = ["missing", "directory", "empty", "binary", "huge", "dev-zero", "unreadable", "symlink-loop",
            "dangling-symlink", "through-a-file", "not-utf8"]
# Text that is not one JSON object, for every JSON reader.
JSON_BAD = {
    "json-list": b"[]", "json-string": b'"text"', "json-number": b"42", "json-null": b"null",
    "json-truncated": b'{"model": ', "json-duplicate-key": b'{"a": 1, "a": 2}',
    "json-deep": b"[" * 100_000 + b"]" * 100_000, "json-bom": b'\xef\xbb\xbf{"a": 1}',
    "json-utf16": '{"a": 1}'.encode("utf-16"), "json-nan": b"NaN", "json-trailing": b'{"a": 1} x',
}
LOCK = json.loads((REPO / "nix" / "python-lock.json").read_text())
KIND_BAD = {
    "settings": {"empty-object": {}, "model-number": {"name": "a", "model": 5},
                 "name-with-space": {"name": "a b", "model": "m"},
                 "port-text": {"name": "a", "model": "m", "port": "80"},
                 "gpus-text": {"name": "a", "model": "m", "gpus": "0"},
                 "environment-number": {"name": "a", "model": "m", "environment": {"X": 1}},
                 "unknown-key": {"name": "a", "model": "m", "modle": "x"},
                 "model-newline": {"name": "a", "model": "m\nExecStartPre=/bin/sh"},
                 "instances-list": {"instances": []}, "instances-empty": {"instances": {}},
                 "instance-number": {"instances": {"a": 5}},
                 "instances-and-more": {"instances": {"a": {"model": "m"}}, "port": 1}},
    "lock": {"empty-object": {}, "version-only": {"version": 1}, "version-2": {**LOCK, "version": 2},
             "systems-list": {**LOCK, "systems": []},
             "size-text": {**LOCK, "systems": {"x86_64-linux": {"packages": {"torch": {
                 **LOCK["systems"]["x86_64-linux"]["packages"]["torch"], "size": "big"}}}}},
             "sha-short": {**LOCK, "systems": {"x86_64-linux": {"packages": {"torch": {
                 **LOCK["systems"]["x86_64-linux"]["packages"]["torch"], "sha256": "abc"}}}}}},
    "fingerprint": {"empty-object": {}, "version-2": {"fingerprint_version": 2},
                    "host-a-list": {"fingerprint_version": 1, "host": []},
                    "checks-of-numbers": {"fingerprint_version": 1, "checks": [1]},
                    "smoke-result-without-one": {"identity": {"unknown": {"x": "no probe"}}}},
    "model_config": {"heads-text": {"num_attention_heads": "16"}, "head-dim-list": {"head_dim": []},
                     "hidden-zero": {"hidden_size": 0}, "kv-heads-bool": {"num_key_value_heads": True}},
    "router_settings": {"empty-object": {}, "workers-text": {"workers": "http://127.0.0.1:1"},
                        "worker-not-a-url": {"workers": ["notaurl"]},
                        "port-text": {"workers": ["http://127.0.0.1:30000"], "port": "x"},
                        "unknown-key": {"workers": ["http://127.0.0.1:30000"], "prot": 1}},
    "router_given": {"workers-given": {"workers": ["http://127.0.0.1:1"]}, "remote-a-number": {"remoteWorkers": 5},
                     "port-text": {"port": "x"}, "unknown-key": {"prot": 1}},
}
TEXT_BAD = {
    "toml": {"toml-syntax": b"[[[", "toml-python-number": b'python = 3\n', "toml-json": b'{"python": "3.12"}',
             "toml-systems-number": b'python = "3.12"\nsystems = 5\n', "toml-unknown-only": b"x = 1\n"},
    "key": {"key-two-words": b"sk one two\n", "key-blank-lines": b"\n\n\n"},
    "jsonl": {"jsonl-not-json": b"not json\n", "jsonl-a-list": b"[1, 2]\n", "jsonl-no-records": b'{"x": 1}\n',
              "jsonl-record-without-hash": b'{"format": 1}\n'},
}
# What stands in for a directory argument that must be one (and have what the command needs).
DIR_BAD = {
    "dir": ["missing", "a-file", "through-a-file"],
    "kernels_dir": ["missing", "a-file", "empty-dir", "index-not-json", "index-other-format"],
}
EXECUTABLE_BAD = ["missing", "directory", "not-executable", "empty-name"]
# Names that must be taken as names, never as shell, options or traversal (the file does not exist).
HOSTILE = {"space": "with space.json", "subst": "$(touch PWNED).json", "backtick": "`touch PWNED`.json",
           "newline": "a\nb.json", "dotdot": "../../../nonexistent-dir/x.json", "tilde": "~/x.json",
           "percent": "%n%s%h.json", "long": "x" * 300, "nul": "a\0b.json"}
# Places no output can go (file outputs; directory outputs get their own).
UNWRITABLE = {"parent-missing": "{out}/no/such/dir/x", "parent-a-file": "{world}/plain/x",
              "a-directory": "{dir}", "proc": "/proc/self/dflashctl-out", "dev-full": "/dev/full",
              "dangling-symlink": "{world}/dangling", "root-dir": "/", "empty": ""}
UNWRITABLE_DIR = {"a-file": "{world}/plain", "under-a-file": "{world}/plain/sub", "proc": "/proc/self/dflashctl-dir",
                  "empty": ""}


# --- the cases --------------------------------------------------------------------------------------

def _at(argv: list[str], arg: str) -> int:
    """Index of the value of `arg` (a flag, or '#N': the N-th word) in argv."""
    return int(arg[1:]) if arg.startswith("#") else argv.index(arg) + 1


def _with(argv: list[str], arg: str, value: str) -> list[str]:
    out = list(argv)
    out[_at(argv, arg)] = value
    return out


def cases_of(name: str, row: dict) -> list[dict]:
    """Every bad case of one row: {id, argv, writes_ok (outputs a success may write)}."""
    base, out = row["argv"], []

    def add(case_id, argv, **kw):
        out.append({"id": case_id, "argv": argv, **kw})

    for arg, kind in row.get("inputs", {}).items():
        if kind == "executable":
            for bad in EXECUTABLE_BAD:
                add(f"{arg}={bad}", _with(base, arg, f"{{bad:executable:{bad}}}"))
        elif kind in DIR_BAD:
            for bad in DIR_BAD[kind]:
                add(f"{arg}={bad}", _with(base, arg, f"{{bad:dir:{bad}}}"))
        else:
            for bad in FILE_BAD:
                add(f"{arg}={bad}", _with(base, arg, f"{{bad:file:{bad}}}"))
            if kind in TEXT_BAD:
                for bad in TEXT_BAD[kind]:
                    add(f"{arg}={bad}", _with(base, arg, f"{{bad:text:{kind}:{bad}}}"))
            else:
                for bad in JSON_BAD:
                    add(f"{arg}={bad}", _with(base, arg, f"{{bad:json:{bad}}}"))
                for bad in KIND_BAD.get(kind, {}):
                    add(f"{arg}={bad}", _with(base, arg, f"{{bad:kind:{kind}:{bad}}}"))
        for h, text in HOSTILE.items():
            add(f"{arg}=hostile-{h}", _with(base, arg, "{out}/" + text))
    for arg, kind in row.get("outputs", {}).items():
        for bad, where in (UNWRITABLE if kind == "file" else UNWRITABLE_DIR).items():
            add(f"{arg}={bad}", _with(base, arg, where))
        for h, text in HOSTILE.items():  # where it cannot be made: refused before any work
            where = "{out}/missing dir/" if kind == "file" else "{world}/plain/"
            add(f"{arg}=hostile-{h}-unmakeable", _with(base, arg, where + text))
            if row.get("writes") and h not in ("dotdot", "nul", "long"):  # in {out}: written as named
                add(f"{arg}=hostile-{h}", _with(base, arg, "{out}/" + text), may_succeed=True)
    for case_id, argv in row.get("bad", {}).items():
        add(case_id, argv)
    return out


ALL = [(name, c) for name, row in CORPUS.items() for c in cases_of(name, row)]


def command_of(row_name: str) -> str:
    return row_name.split()[0]


# --- the world the cases run in ---------------------------------------------------------------------

SETTINGS = {"name": "a", "model": "Qwen/Qwen3-8B", "port": 30000, "gpus": [0],
            "modelRevision": "0e9e39f249a16976918f6564b8830bc894c89659"}


def _write_json(path: Path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def world(tmp_path):
    """Good files for the placeholders, and a factory for the bad ones; all under one directory
    whose every file is compared before and after each case."""
    w = tmp_path / "world"
    (w / "out").mkdir(parents=True)
    (w / "dir").mkdir()
    (w / "plain").write_text("a plain file\n")
    (w / "dangling").symlink_to(w / "nowhere")
    lock = LOCK
    without_torch = json.loads(json.dumps(lock))
    for system in without_torch["systems"].values():
        system["packages"].pop("torch")
    kernels_dir = w / "kernels"
    kernels_dir.mkdir()
    (kernels_dir / "index.json").write_text(json.dumps({"format": 1, "built": {"9.0": []}, "archs": ["9.0"]}))
    router_full = {"workers": ["http://127.0.0.1:30000"], "instanceUnits": ["dflash-a.service"]}
    python_bare = w / "python-bare"  # a real Python 3, blind to site-packages: no sglang_router there
    python_bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python_bare.chmod(0o755)
    values = {
        "world": str(w), "out": str(w / "out"), "dir": str(w / "dir"), "repo": str(REPO),
        "python": sys.executable, "visible_exe": shutil.which("true"),
        "settings": _write_json(w / "a.json", SETTINGS),
        "settings_same_port": _write_json(w / "b.json", {**SETTINGS, "name": "b", "gpus": [1]}),
        "multi": _write_json(w / "multi.json", {"instances": {"a": {"model": "m", "gpus": [0]},
                                                              "b": {"model": "m", "gpus": [1], "port": 30001}}}),
        "dflash": _write_json(w / "dflash.json", {**SETTINGS, "draftModel": "z-lab/Qwen3-8B-DFlash-b16",
                                                  "speculative": {"algorithm": "DFLASH"}}),
        "local_model": _write_json(w / "local.json", {"name": "l", "model": "/srv/models/qwen"}),
        "lock": _write_json(w / "python-lock.json", lock),
        "lock_without_torch": _write_json(w / "lock-without-torch.json", without_torch),
        "spec": str(shutil.copy(REPO / "nix" / "stack.toml", w / "stack.toml")),
        "fingerprint": str(shutil.copy(REPO / "docs" / "gpu" / "fingerprint-good.json", w / "fp.json")),
        "router_settings": _write_json(w / "router-given.json", {}),
        "router_full": _write_json(w / "router.json", router_full),
        "router_bad": _write_json(w / "router-bad.json", {**router_full, "port": 30000}),
        "python_bare": str(python_bare),
        "model_config": _write_json(w / "config.json", {"num_attention_heads": 16, "head_dim": 64,
                                                         "num_key_value_heads": 8, "hidden_size": 1024}),
        "record": str(w / "record.jsonl"), "key": str(w / "key"), "kernels_dir": str(kernels_dir),
    }
    Path(values["record"]).write_text(json.dumps({"format": 1, "hash": "0" * 64}) + "\n")
    Path(values["key"]).write_text("sk-test\n")
    bad_dir = w / "bad"
    bad_dir.mkdir()

    def bad(spec: str) -> str:
        parts = spec.split(":")
        path = bad_dir / "-".join(parts[1:]).replace("/", "_")
        group, what = parts[0], parts[-1]
        if group == "file":
            return _bad_file(path, what, w)
        if group == "json":
            path.write_bytes(JSON_BAD[what])
        elif group == "kind":
            path.write_text(json.dumps(KIND_BAD[parts[1]][what]))
        elif group == "text":
            path.write_bytes(TEXT_BAD[parts[1]][what])
        elif group == "dir":
            return _bad_dir(path, what, w)
        elif group == "executable":
            return _bad_executable(path, what, w)
        return str(path)

    return w, values, bad


def _bad_file(path: Path, what: str, w: Path) -> str:
    if what == "missing":
        return str(path)
    if what == "directory":
        path.mkdir()
    elif what == "empty":
        path.write_bytes(b"")
    elif what == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif what == "huge":  # sparse: 2 GiB of zeros that cost no disk
        with open(path, "wb") as f:
            f.truncate(2 << 30)
    elif what == "dev-zero":
        return "/dev/zero"
    elif what == "unreadable":
        if ROOT:
            return "/proc/self/mem"  # open works, read fails (EIO), whoever reads it
        path.write_text('{"name": "a", "model": "m"}')
        path.chmod(0)
    elif what == "symlink-loop":
        path.symlink_to(path)
    elif what == "dangling-symlink":
        path.symlink_to(w / "nowhere")
    elif what == "through-a-file":
        return str(w / "plain" / "x.json")
    elif what == "not-utf8":
        path.write_bytes(b'{"name": "\xff\xfe"}')
    return str(path)


def _bad_dir(path: Path, what: str, w: Path) -> str:
    if what == "missing":
        return str(path)
    if what == "a-file":
        return str(w / "plain")
    if what == "through-a-file":
        return str(w / "plain" / "sub")
    path.mkdir()
    if what == "index-not-json":
        (path / "index.json").write_text("{")
    elif what == "index-other-format":
        (path / "index.json").write_text(json.dumps({"format": 99, "built": {}}))
    return str(path)


def _bad_executable(path: Path, what: str, w: Path) -> str:
    if what == "missing":
        return str(path)
    if what == "directory":
        path.mkdir()
    elif what == "not-executable":
        path.write_text("#!/bin/sh\nexit 0\n")
    elif what == "empty-name":
        return ""
    return str(path)


def fill(argv: list[str], values: dict, bad) -> list[str]:
    out = []
    for word in argv:
        if word.startswith("{bad:"):
            out.append(bad(word[1:-1]))
            continue
        for key, value in values.items():
            word = word.replace("{" + key + "}", value)
        out.append(word)
    return out


def snapshot(root: Path) -> dict:
    """Every entry under `root`: kind, and for files size, mtime and mode (what a write changes)."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            seen[str(p.relative_to(root))] = (st.st_mode, None if p.is_dir() else (st.st_size, st.st_mtime_ns))
    return seen


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to connect anywhere but a Unix socket, recorded (none may happen)."""
    attempts = []
    real = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)
            raise ConnectionRefusedError(111, "the contract test allows no network")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", lambda self, a: attempts.append(a) or 111)
    return attempts


# --- the contract -----------------------------------------------------------------------------------

def check_failure(command: str, rc: int, out: str, err: str, case_id: str) -> None:
    allowed = exit_codes.codes(command)
    assert rc in allowed, f"{case_id}: exit {rc} is not in {command}'s documented set {allowed}\n{err}"
    assert rc != errors.OK, f"{case_id}: a bad input was accepted\n{out}\n{err}"
    assert "Traceback" not in out + err, f"{case_id}:\n{err}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, f"{case_id}: nothing on stderr"
    assert lines[-1].startswith("  fix: ") and len(lines[-1]) > len("  fix: ") + 5, \
        f"{case_id}: the last line is not a fix:\n{err}"
    assert any(ln.startswith(("dflashctl ", "dflashctl:")) for ln in lines), f"{case_id}: what failed?\n{err}"


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    old = signal.getsignal(signal.SIGTERM)
    try:
        rc = cli.main(argv)
    finally:
        signal.signal(signal.SIGTERM, old)  # smoke sets its own
    got = capsys.readouterr()
    return rc, got.out, got.err


def check_json(rc: int, out: str, case_id: str) -> None:
    try:
        obj = json.loads(out)
    except ValueError:
        pytest.fail(f"{case_id}: --json printed no single JSON object: {out[:300]!r}")
    assert isinstance(obj, dict) and obj.get("ok") is False, (case_id, obj)
    e = obj.get("error")
    assert isinstance(e, dict) and e.get("exit_code") == rc, (case_id, obj)
    assert all(isinstance(e.get(k), str) for k in ("what", "why", "fix")) and e["what"] and e["fix"], obj


@pytest.mark.parametrize("row_name,case", ALL, ids=[f"{n}:{c['id']}" for n, c in ALL])
def test_bad_input_keeps_the_contract(row_name, case, world, capsys, monkeypatch, no_network):
    w, values, bad = world
    row = CORPUS[row_name]
    monkeypatch.chdir(w)
    argv = fill(case["argv"], values, bad)
    before = snapshot(w)
    rc, out, err = run_in_process(argv, capsys)
    assert not no_network, f"{case['id']}: tried to connect to {no_network}"
    assert not (w / "PWNED").exists() and not (w / "out" / "PWNED").exists()
    after = snapshot(w)
    if case.get("may_succeed") and rc == errors.OK:  # a strange name in a good place: written as named
        created = set(after) - set(before)
        assert created and all(c.startswith("out/") for c in created), (case["id"], created)
        assert "Traceback" not in out + err, err
        return
    check_failure(command_of(row_name), rc, out, err, case["id"])
    expected = row.get("exit", {}).get(case["id"])
    assert expected is None or rc == expected, f"{case['id']}: exit {rc}, not {expected}: the cause named wrong?\n{err}"
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    allowed = {str(Path(argv[_at(argv, a)]).relative_to(w)) for a in row.get("writes_on_failure", [])
               if a in argv and argv[_at(argv, a)].startswith(str(w))}
    assert changed <= allowed, f"{case['id']}: files changed on failure: {sorted(changed)}"
    if row.get("json"):
        rc2, out2, err2 = run_in_process(argv + ["--json"], capsys)
        assert rc2 == rc, (case["id"], err2)
        check_json(rc2, out2, case["id"])
        assert snapshot(w) == after


GOOD = [(name, case_id, argv) for name, row in CORPUS.items() for case_id, argv in row.get("good", {}).items()]


@pytest.mark.parametrize("row_name,case_id,argv", GOOD, ids=[f"{n}:{c}" for n, c, _ in GOOD])
def test_good_input_succeeds(row_name, case_id, argv, world, capsys, monkeypatch, no_network):
    w, values, bad = world
    monkeypatch.chdir(w)
    argv = fill(argv, values, bad)
    before = snapshot(w)
    rc, out, err = run_in_process(argv, capsys)
    assert rc == errors.OK, f"{case_id}: exit {rc}\n{err}"
    assert "Traceback" not in out + err and not no_network, err
    changed = {k for k in set(before) | set(snapshot(w)) if before.get(k) != snapshot(w).get(k)}
    assert all(c.startswith("out/") for c in changed), f"{case_id}: wrote outside out/: {sorted(changed)}"
    if CORPUS[row_name].get("json"):
        rc2, out2, err2 = run_in_process(argv + ["--json"], capsys)
        assert rc2 == errors.OK, err2
        obj = json.loads(out2)
        assert isinstance(obj, dict) and obj.get("ok", True) is True, obj


def test_every_exit_names_a_case_of_its_row():
    for name, row in CORPUS.items():
        unknown = set(row.get("exit", {})) - set(row.get("bad", {}))
        assert not unknown, f"{name}: exit names cases that are not in bad: {sorted(unknown)}"


def test_every_command_has_a_row_and_enough_cases():
    """Adding a subcommand means adding its row (tests/data/cli/contract.json)."""
    rows = {command_of(n) for n in CORPUS}
    missing = sorted(set(cli.COMMANDS) - rows)
    assert not missing, f"no contract row for {missing}: add one to tests/data/cli/contract.json"
    assert not rows - set(cli.COMMANDS), rows - set(cli.COMMANDS)
    per_command: dict[str, int] = {}
    for name, _ in ALL:
        per_command[command_of(name)] = per_command.get(command_of(name), 0) + 1
    few = {c: n for c, n in per_command.items() if n < MIN_CASES}
    assert not few, f"fewer than {MIN_CASES} bad inputs: {few}"


# --- the same in a real process ---------------------------------------------------------------------

def run_subprocess(argv: list[str], cwd: Path, fsize: int | None = None) -> subprocess.CompletedProcess:
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([sys.executable, "-m", "dflashctl", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=60, preexec_fn=limit, env=env)


SAMPLE = [(n, c) for n in CORPUS for c in [x for m, x in ALL if m == n][:3:2]
          if "nul" not in c["id"]]


@pytest.mark.parametrize("row_name,case", SAMPLE, ids=[f"{n}:{c['id']}" for n, c in SAMPLE])
def test_a_real_process_agrees_with_the_in_process_run(row_name, case, world, capsys, monkeypatch, no_network):
    w, values, bad = world
    monkeypatch.chdir(w)
    argv = fill(case["argv"], values, bad)
    rc, out, err = run_in_process(argv, capsys)
    p = run_subprocess(argv, w)
    assert (p.returncode, p.stdout, p.stderr) == (rc, out, err)


WRITERS = [n for n, row in CORPUS.items() if row.get("writes")]


@pytest.mark.parametrize("row_name", WRITERS)
def test_a_full_file_system_leaves_the_old_files_as_they_were(row_name, world):
    """RLIMIT_FSIZE below the output's size: the write fails (EFBIG, Python ignores SIGXFSZ), the
    command says so with OUTPUT, the old file is unchanged and no temporary file is left."""
    w, values, bad = world
    row = CORPUS[row_name]
    argv = fill(row["argv"], values, bad)
    old = {}
    for arg in row["outputs"]:
        path = Path(argv[_at(argv, arg)])
        path.write_text("the old, good file\n")
        old[path] = path.read_text()
    before = sorted(os.listdir(w / "out"))
    p = run_subprocess(argv, w, fsize=256)
    assert p.returncode == errors.OUTPUT, p.stderr
    assert "Traceback" not in p.stderr and "file size limit" in p.stderr, p.stderr
    assert p.stderr.splitlines()[-1].startswith("  fix: ")
    for path, text in old.items():
        assert path.read_text() == text, path
    assert sorted(os.listdir(w / "out")) == before  # no temporary file left behind
    ok = run_subprocess(argv, w)  # the same command with room: every output written whole
    assert ok.returncode == 0, ok.stderr
    assert all(path.read_text() != text for path, text in old.items())


# --- the exit codes, in one table ---------------------------------------------------------------------

def _error_codes() -> dict[str, int]:
    return {k: v for k, v in vars(errors).items() if k.isupper() and isinstance(v, int) and not isinstance(v, bool)}


def test_the_exit_code_table_is_errors_py():
    """Every code in errors.py has its meaning in exit_codes.MEANING, and nothing else does; every
    row names codes that exist (a new code, or a command, adds itself to exit_codes.py)."""
    codes = set(_error_codes().values())
    assert set(exit_codes.MEANING) == codes, (
        f"add to exit_codes.MEANING: {sorted(codes - set(exit_codes.MEANING))}; "
        f"not in errors.py: {sorted(set(exit_codes.MEANING) - codes)}")
    assert set(exit_codes.BY_COMMAND) == set(cli.COMMANDS)
    for command in cli.COMMANDS:
        assert set(exit_codes.codes(command)) <= codes, command
    assert set(errors.NO_RESTART) <= set(exit_codes.codes("serve"))


def _markdown_table(text: str, header: str) -> list[list[str]]:
    lines = text.split(header, 1)[1].strip().splitlines()[1:]  # past the header and its rule
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_docs_cli_md_shows_the_same_table():
    doc = (REPO / "docs" / "cli.md").read_text()
    per_command = {cmd.strip("`"): [int(c) for c in codes.split(", ")]
                   for cmd, codes in _markdown_table(doc, "| command | exit codes |")}
    assert per_command == {c: list(exit_codes.codes(c)) for c in cli.COMMANDS}
    meanings = {int(code): meaning for code, meaning in _markdown_table(doc, "| code | meaning |")}
    assert meanings == exit_codes.MEANING


def test_each_help_prints_its_row(capsys):
    for command in cli.COMMANDS:
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        out = capsys.readouterr().out
        assert "exit codes (docs/cli.md):" in out, command
        for code in exit_codes.codes(command):
            assert f"{code:>5}  {exit_codes.meaning(command, code)}" in out, (command, code)
