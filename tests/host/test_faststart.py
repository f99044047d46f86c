"""The fast start's mechanism (host/kernel_hook/dflash_faststart.py) in real processes: a program
that spawns children as SGLang does, with the start-up hook on PYTHONPATH. Counted, not timed:
which processes import the heavy module, who is each child's parent, what it sees of the
environment, and every reason a child is spawned after all, named in the log. CUDA cannot run
here: a stand-in `torch` (tmp dir) has the entry points the template fences off."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dflashctl.host import faststart, kernels, probes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux only")

PROGRAM = """
import multiprocessing as mp, os, sys
import heavy

def child(writer):
    import heavy
    writer.send({"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                 "late": os.environ.get("LATE"), "set": os.environ.get("SET_AT_START")})

if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)   # as SGLang's engine does
    for pair in sys.argv[1:]:                  # what the server sets before starting its children
        key, _, value = pair.partition("=")
        os.environ[key] = value
    reader, writer = mp.Pipe(duplex=False)
    procs = [mp.Process(target=child, args=(writer,), name=f"child{i}") for i in range(2)]
    for p in procs:
        p.start()
    got = [reader.recv() for _ in procs]
    for p in procs:
        p.join(30)
    print(json.dumps({"server": os.getpid(), "pgid": os.getpgid(0), "children": got,
                      "exitcodes": [p.exitcode for p in procs]}))
""".replace("import multiprocessing", "import json, multiprocessing")

HEAVY = """
import os
with open(os.environ["IMPORT_LOG"], "a") as f:
    f.write(f"{os.getpid()}\\n")
os.environ.get("READ_AT_IMPORT")
"""


def run(tmp_path, preload=("heavy",), setting=True, sets=(), env=None, program=PROGRAM):
    (tmp_path / "prog.py").write_text(program)
    (tmp_path / "heavy.py").write_text(HEAVY)
    (tmp_path / "list.json").write_text(json.dumps({"preload": list(preload)}))
    log = tmp_path / "imports"
    log.unlink(missing_ok=True)
    child_env = {k: v for k, v in os.environ.items() if k != faststart.ENV}
    child_env.update(PYTHONPATH=str(kernels.HOOK_DIR), IMPORT_LOG=str(log), SET_AT_START="yes", **(env or {}))
    if setting is True:
        child_env[faststart.ENV] = str(tmp_path / "list.json")
    elif setting:
        child_env[faststart.ENV] = setting
    r = subprocess.run([sys.executable, str(tmp_path / "prog.py"), *sets], env=child_env, capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    out["imports"] = [int(x) for x in log.read_text().split()]
    out["log"] = r.stderr
    return out


def test_children_are_forked_from_the_template_as_the_server_s_own(tmp_path):
    out = run(tmp_path, sets=["LATE=set by the server before its children"])
    server, kids = out["server"], out["children"]
    assert len(out["imports"]) == 2 and server in out["imports"]  # the server, the template: once each
    assert not {k["pid"] for k in kids} & set(out["imports"])
    for k in kids:
        assert k["ppid"] == server and k["pgid"] == out["pgid"]  # re-parented, same process group
        assert k["late"] == "set by the server before its children" and k["set"] == "yes"
    assert out["exitcodes"] == [0, 0]
    assert out["log"].count("forked from the template") == 2
    assert "template ready: 1 modules imported" in out["log"]


@pytest.mark.parametrize("setting", [False, "0"])
def test_off_is_plain_spawn(tmp_path, setting):
    out = run(tmp_path, setting=setting)
    assert sorted(out["imports"]) == sorted([out["server"]] + [k["pid"] for k in out["children"]])
    assert all(k["ppid"] == out["server"] for k in out["children"])
    assert "[dflash faststart]" not in out["log"]


@pytest.mark.parametrize("sets, why", [
    (["READ_AT_IMPORT=other"], "READ_AT_IMPORT changed since the template read it while importing"),
    (["LD_PRELOAD="], "LD_PRELOAD changed since the template started (read at exec only)"),
    (["PYTHONHASHSEED=7"], "PYTHONHASHSEED changed since the template started (read at exec only)"),
])
def test_a_child_whose_start_would_differ_is_spawned(tmp_path, sets, why):
    out = run(tmp_path, sets=sets)
    assert len(out["imports"]) == 4  # the server, the template, and each spawned child
    assert out["log"].count(f"spawned: {why}") == 2
    assert all(k["ppid"] == out["server"] for k in out["children"])


def test_a_variable_no_preloaded_module_read_is_simply_passed_on(tmp_path):
    out = run(tmp_path, sets=["LATE=x", "NCCL_CUMEM_ENABLE=0"])
    assert len(out["imports"]) == 2 and all(k["late"] == "x" for k in out["children"])


def test_a_preload_that_fails_leaves_spawn(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('half imported')\n")
    out = run(tmp_path, preload=["heavy", "not_installed_anywhere", "broken"])
    assert "template not usable: importing broken: RuntimeError: half imported" in out["log"]
    assert out["log"].count("spawned: the template is not usable") == 2
    assert len(out["imports"]) == 4


FAKE_TORCH = """
import os
class _C:
    @staticmethod
    def _cuda_init():
        open(os.environ["CUDA_LOG"], "a").write("init\\n")
    @staticmethod
    def _cuda_getDeviceCount():
        open(os.environ["CUDA_LOG"], "a").write("count\\n")
        return 1
class cuda:
    @staticmethod
    def _nvml_based_avail():
        return False
    @staticmethod
    def is_available():  # torch's rule: NVML when asked, else the runtime (which initialises CUDA)
        return True if cuda._nvml_based_avail() else _C._cuda_getDeviceCount() > 0
    @staticmethod
    def is_initialized():
        return False
    @staticmethod
    def _is_in_bad_fork():
        return False
"""


@pytest.mark.parametrize("module, source, usable", [
    ("asks_available", "import torch\nOK = torch.cuda.is_available()\n", True),
    ("inits_cuda", "import torch\ntorch._C._cuda_init()\n", False),
])
def test_cuda_is_fenced_off_in_the_template(tmp_path, module, source, usable):
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / f"{module}.py").write_text(source)
    cuda_log = tmp_path / "cuda"
    out = run(tmp_path, preload=["torch", module, "heavy"], env={"CUDA_LOG": str(cuda_log)})
    assert not cuda_log.exists()  # nothing reached CUDA in the template: availability came from NVML
    if usable:
        assert len(out["imports"]) == 2 and out["log"].count("forked from the template") == 2
    else:
        assert f"importing {module}: it initialises CUDA (torch._C._cuda_init)" in out["log"]
        # the template stopped there (heavy never imported in it): the server and both children import
        assert len(out["imports"]) == 3 and out["log"].count("spawned: the template is not usable") == 2


def test_a_python_c_process_starts_no_template(tmp_path):
    """Probes and multiprocessing's own helpers run as `python -c`: never a template there."""
    (tmp_path / "list.json").write_text(json.dumps({"preload": ["json"]}))
    env = dict(os.environ, PYTHONPATH=str(kernels.HOOK_DIR), **{faststart.ENV: str(tmp_path / "list.json")})
    r = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('DFLASH_FASTSTART'))"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == str(tmp_path / "list.json") and "[dflash faststart]" not in r.stderr


def test_an_unreadable_list_says_so_and_spawns(tmp_path):
    out = run(tmp_path, setting=str(tmp_path / "missing.json"))
    assert "off: cannot read the preload list" in out["log"] and len(out["imports"]) == 3


def test_provide_on_off_and_an_instance_s_own_list():
    base = {"PYTHONPATH": "/x"}
    on = faststart.provide(base, True)
    assert on[faststart.ENV] == str(faststart.PRELOAD) and on["PYTHONPATH"].split(os.pathsep) == [
        str(kernels.HOOK_DIR), "/x"]
    assert json.loads(faststart.PRELOAD.read_text())["preload"][0] == "torch"
    assert faststart.ENV not in faststart.provide({faststart.ENV: "/mine.json"}, False)
    assert faststart.provide({faststart.ENV: "/mine.json"}, True)[faststart.ENV] == "/mine.json"
    assert faststart.provide({faststart.ENV: "0"}, True) == {faststart.ENV: "0"}  # no hook for it


def test_doctor_tries_it_in_the_interpreter():
    r = probes.run_probe(sys.executable, "faststart", str(kernels.HOOK_DIR), timeout=60)
    check = faststart.check(r)
    assert check.status == "ok", (r, check)
    broken = faststart.check({"ok": True, "facts": {"ok": False, "why": "prctl is not available (x)"}})
    assert broken.status == "warn" and "prctl is not available" in broken.summary
    assert "fastStart = false" in broken.fix
    failed = faststart.check({"ok": False, "error": "cannot run /nope"})
    assert failed.status == "warn" and "cannot run /nope" in failed.summary
