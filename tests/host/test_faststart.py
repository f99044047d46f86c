"""The fast start's mechanism (host/kernel_hook/dflash_faststart.py) in real processes: a program
that spawns children as SGLang does, with the start-up hook on PYTHONPATH. Counted, not timed:
which processes import the heavy module, who is each child's parent, what it sees of the
environment, and every reason a child is spawned after all, named in the log. CUDA cannot run
here: a stand-in `torch` (tmp dir) has the entry points the template fences off."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import jemalloc_or_skip
from dflashctl.host import faststart, kernels, probes
from dflashctl.host.kernel_hook import dflash_faststart as faststart_hook

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

SETS_LINE = PROGRAM.splitlines().index("        os.environ[key] = value") + 1  # the server's own change

HEAVY = """
import os
with open(os.environ["IMPORT_LOG"], "a") as f:
    f.write(f"{os.getpid()}\\n")
os.environ.get("READ_AT_IMPORT")
"""


def run(tmp_path, preload=("heavy",), setting=True, sets=(), env=None, program=PROGRAM, heavy=HEAVY,
        env_first=None):
    (tmp_path / "prog.py").write_text(program)
    (tmp_path / "heavy.py").write_text(heavy)
    (tmp_path / "list.json").write_text(json.dumps({"preload": list(preload)}))
    log = tmp_path / "imports"
    log.unlink(missing_ok=True)
    child_env = dict(env_first or {})  # first in the server's environment (exec keeps the order)
    child_env.update((k, v) for k, v in os.environ.items() if k != faststart.ENV)
    child_env.update(PYTHONPATH=str(kernels.HOOK_DIR), IMPORT_LOG=str(log), SET_AT_START="yes")
    child_env.update(env or {})
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


NAMES_ITSELF = PROGRAM.replace("""def child(writer):
    import heavy
""", """def child(writer):
    import heavy, setproctitle
    setproctitle.setproctitle("standin::scheduler")  # as SGLang's scheduler names itself
    with open("/proc/self/cmdline", "rb") as f:
        os.environ["TITLE"] = f.read().split(b"\\0")[0].decode()
""").replace('"set": os.environ.get("SET_AT_START")', '"set": os.environ.get("TITLE")')


@pytest.mark.parametrize("preload, first_changes", [
    (("heavy", "setproctitle"), False),  # the shipped list has setproctitle: it is set up in the template
    (("heavy", "setproctitle"), True),  # ... also where the server changed the environment's first variable
    (("heavy",), False),  # set up in the child: the template's environment left where exec put it
])
def test_a_forked_child_s_process_title_is_the_one_it_sets(tmp_path, preload, first_changes):
    # ps, top and doctor's GPU lines name SGLang's processes by the title they set; forked from the
    # template, a child must not keep the template's `python -c ... template_main()`
    env = {"AAA_FIRST": "at the start"}  # first in the environment the template is started with
    out = run(tmp_path, preload=preload, program=NAMES_ITSELF, env_first=env,
              sets=["AAA_FIRST=changed by the server"] if first_changes else ())
    assert out["log"].count("forked from the template") == 2
    assert [k["set"] for k in out["children"]] == ["standin::scheduler"] * 2


@pytest.mark.parametrize("setting", [False, "0"])
def test_off_is_plain_spawn(tmp_path, setting):
    out = run(tmp_path, setting=setting)
    assert sorted(out["imports"]) == sorted([out["server"]] + [k["pid"] for k in out["children"]])
    assert all(k["ppid"] == out["server"] for k in out["children"])
    assert "[dflash faststart]" not in out["log"]


def test_a_variable_the_templates_imports_read_that_changes_later_makes_the_child_spawned(tmp_path):
    out = run(tmp_path, sets=["READ_AT_IMPORT=other"])
    assert len(out["imports"]) == 4  # the server, the template, and each spawned child
    assert out["log"].count("spawned: READ_AT_IMPORT changed since the template read it while importing") == 2
    assert all(k["ppid"] == out["server"] for k in out["children"])


# scikit-learn's import, in the server and in the template alike (seen on the H100)
SETS_A_DEFAULT = HEAVY + 'os.environ.setdefault("OPENMP_AT_FORK", "FALSE")\n'
SETS_A_DEFAULT_LINE = SETS_A_DEFAULT.count("\n")
REPORTS_IT = PROGRAM.replace('"set": os.environ.get("SET_AT_START")',
                             '"set": os.environ.get("SET_AT_START"), "omp": os.environ.get("OPENMP_AT_FORK")')


def test_a_variable_the_server_s_imports_set_as_the_template_s_did_keeps_the_children_forked(tmp_path):
    out = run(tmp_path, heavy=SETS_A_DEFAULT, program=REPORTS_IT)
    assert out["log"].count("forked from the template") == 2, out["log"]
    assert len(out["imports"]) == 2  # the server and the template only
    assert out["log"].count(f"template: OPENMP_AT_FORK set by heavy:{SETS_A_DEFAULT_LINE} in the server as in the "
                            "template's own imports (None -> 'FALSE': the same change; its children fork)") == 1
    assert all(k["omp"] == "FALSE" for k in out["children"])


def test_the_module_that_reads_the_whole_environment_is_named(tmp_path):
    """Not collections.abc, through which os.environ.items() iterates (on the H200 the log named it)."""
    out = run(tmp_path, heavy=HEAVY + "sorted(os.environ.items())\n")
    assert "os.environ read whole while importing by heavy;" in out["log"], out["log"]


@pytest.mark.parametrize("how", ["set before the import, by the program", "changed after it"])
def test_the_same_variable_set_otherwise_still_spawns(tmp_path, how):
    """The same value written by another line (the module then read it set, as the template's did not),
    or the template's value changed later: the template's import did not run as the server's."""
    if how.startswith("set before"):
        program, sets = REPORTS_IT.replace("import heavy\n", 'os.environ["OPENMP_AT_FORK"] = "FALSE"\nimport heavy\n', 1), []
    else:
        program, sets = REPORTS_IT, ["OPENMP_AT_FORK=TRUE"]
    out = run(tmp_path, heavy=SETS_A_DEFAULT, program=program, sets=sets)
    assert out["log"].count("spawned: OPENMP_AT_FORK changed since the template read it while importing") == 2, \
        out["log"]
    assert "the same change" not in out["log"]
    assert len(out["imports"]) == 4
    assert {k["omp"] for k in out["children"]} == {"FALSE" if how.startswith("set before") else "TRUE"}


# The child reports what its loader and interpreter were started with (/proc/self/environ is the
# environment of its exec: for a forked child, the template's) and a string hash (PYTHONHASHSEED).
REPORTS_ITS_START = PROGRAM.replace(
    '"set": os.environ.get("SET_AT_START")',
    '"set": os.environ.get("SET_AT_START"), "hash": hash("dflash"), "exec_env": dict(kv.split("=", 1) for kv in '
    'open("/proc/self/environ").read().split("\\0") if "=" in kv)')


def hash_with_seed(seed: str) -> int:
    r = subprocess.run([sys.executable, "-c", 'print(hash("dflash"))'], env={**os.environ, "PYTHONHASHSEED": seed},
                       capture_output=True, text=True, check=True)
    return int(r.stdout)


def library_dirs(tmp_path, *names) -> str:
    """A library path of directories that exist (a change to one the loader would search)."""
    for name in names:
        (tmp_path / name).mkdir(exist_ok=True)
    return ":".join(str(tmp_path / name) for name in names)


@pytest.mark.parametrize("key, value", [("LD_LIBRARY_PATH", "{tmp}/first:{tmp}/cuda-lib"), ("PYTHONHASHSEED", "7"),
                                        ("LD_PRELOAD", "")])
def test_a_variable_read_at_exec_that_the_server_changes_starts_the_template_over(tmp_path, key, value):
    """On the H200 SGLang's server changed LD_LIBRARY_PATH after the template had started, and every
    child was spawned. The template starts over from the server's new environment: the children are
    forked, and what their loader and interpreter were started with is what a spawned child's is."""
    library_dirs(tmp_path, "first", "cuda-lib")
    value = value.format(tmp=tmp_path)
    out = run(tmp_path, sets=[f"{key}={value}"], env={"LD_LIBRARY_PATH": library_dirs(tmp_path, "first")},
              program=REPORTS_ITS_START)
    assert (f"template: {key} changed in the server (set by __main__:{SETS_LINE}); it starts over from the new "
            "environment") in out["log"]
    assert out["log"].count("forked from the template") == 2, out["log"]
    assert not {k["pid"] for k in out["children"]} & set(out["imports"])
    for k in out["children"]:
        assert k["exec_env"].get(key) == value and k["ppid"] == out["server"]
        if key == "PYTHONHASHSEED":
            assert k["hash"] == hash_with_seed(value)


def test_a_server_that_keeps_changing_them_spawns_its_children_naming_who_and_what(tmp_path):
    sets = ["LD_PRELOAD=", "PYTHONHASHSEED=7", "LD_BIND_NOW=1",
            f"LD_LIBRARY_PATH={library_dirs(tmp_path, 'first', 'cuda-lib')}"]
    out = run(tmp_path, sets=sets, env={"LD_LIBRARY_PATH": library_dirs(tmp_path, "first")})
    assert out["log"].count("it starts over from the new environment") == faststart_hook.MAX_TEMPLATE_RESTARTS == 3
    assert out["log"].count("spawned: LD_LIBRARY_PATH changed since the template started (read at exec only: "
                            f"LD_LIBRARY_PATH set by __main__:{SETS_LINE}: +{tmp_path}/cuda-lib)") == 2, out["log"]


# A preloaded module that reads LD_LIBRARY_PATH while it is imported, as library finders do.
READS_THE_LIBRARY_PATH = HEAVY.replace('os.environ.get("READ_AT_IMPORT")', 'os.environ.get("LD_LIBRARY_PATH")')


@pytest.mark.parametrize("added", ["{tmp}/no-such-lib64:", "{tmp}/no-such-lib64:{tmp}/gone:"])
def test_a_library_path_that_only_gains_directories_that_do_not_exist_keeps_the_template(tmp_path, added):
    """On the H200, OpenCV's cv2 (in the image) put its wheel's lib64, which does not exist, in front of
    LD_LIBRARY_PATH 13 s into the server's imports; the template started over and the server waited
    9 s for it. The loader searches the same directories either way: the children are forked from
    the template as it was, and see the server's new value in their environment."""
    first = library_dirs(tmp_path, "first")
    value = added.format(tmp=tmp_path) + first
    program = REPORTS_ITS_START.replace('"set": os.environ.get("SET_AT_START")',
                                        '"set": os.environ.get("SET_AT_START"), "ld": os.environ.get("LD_LIBRARY_PATH")')
    out = run(tmp_path, sets=[f"LD_LIBRARY_PATH={value}"], env={"LD_LIBRARY_PATH": first}, program=program,
              heavy=READS_THE_LIBRARY_PATH)
    assert "starts over" not in out["log"], out["log"]
    assert out["log"].count("(directories that do not exist: the loader searches the same; the template goes "
                            "on)") == 1, out["log"]
    assert out["log"].count("forked from the template") == 2, out["log"]
    assert len(out["imports"]) == 2  # the server and the template: no child imported it again
    for k in out["children"]:
        assert k["exec_env"]["LD_LIBRARY_PATH"] == first  # the template's loader: the same directories
        assert k["ld"] == value and k["ppid"] == out["server"]


def test_a_library_path_that_gains_an_empty_entry_is_a_change(tmp_path):
    """An empty entry is the working directory: the loader would search one more directory."""
    first = library_dirs(tmp_path, "first")
    out = run(tmp_path, sets=[f"LD_LIBRARY_PATH={first}:"], env={"LD_LIBRARY_PATH": first})
    assert "LD_LIBRARY_PATH changed in the server" in out["log"] and "starts over" in out["log"], out["log"]


def test_the_interpreter_s_own_sitecustomize_runs_before_the_template_starts(tmp_path):
    """An image's sitecustomize (which the hook's shadows and runs) that extends LD_LIBRARY_PATH: the
    template starts from the environment after it, so the children are forked, their loader seeing
    what a spawned child's would."""
    site = tmp_path / "image-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        'import os\nos.environ["LD_LIBRARY_PATH"] = "/opt/image/lib:" + os.environ.get("LD_LIBRARY_PATH", "")\n')
    program = PROGRAM.replace('"set": os.environ.get("SET_AT_START")',
                              '"set": os.environ.get("SET_AT_START"), "ld": os.environ.get("LD_LIBRARY_PATH")')
    out = run(tmp_path, program=program,
              env={"PYTHONPATH": f"{kernels.HOOK_DIR}:{site}", "LD_LIBRARY_PATH": "/opt/first"})
    assert out["log"].count("forked from the template") == 2, out["log"]
    assert all(k["ld"] == "/opt/image/lib:/opt/first" for k in out["children"]), out["children"]


def test_a_variable_no_preloaded_module_read_is_simply_passed_on(tmp_path):
    out = run(tmp_path, sets=["LATE=x", "NCCL_CUMEM_ENABLE=0"])
    assert len(out["imports"]) == 2 and all(k["late"] == "x" for k in out["children"])


def test_a_preload_that_fails_is_left_out_and_the_template_starts_over(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('half imported')\n")
    out = run(tmp_path, preload=["heavy", "not_installed_anywhere", "broken"])
    assert ("template: broken left out: its import failed (RuntimeError: half imported); starting over "
            "without it") in out["log"]
    assert "1 left out (broken)" in out["log"] and out["log"].count("forked from the template") == 2
    template = [pid for pid in out["imports"] if pid != out["server"]]
    assert len(template) == 2 and len(set(template)) == 1  # one process (exec'd afresh), heavy imported twice
    assert not {k["pid"] for k in out["children"]} & set(out["imports"])


def test_a_template_that_keeps_failing_gives_up_and_spawns(tmp_path):
    for i in range(4):
        (tmp_path / f"broken{i}.py").write_text(f"raise RuntimeError('broken {i}')\n")
    out = run(tmp_path, preload=["heavy"] + [f"broken{i}" for i in range(4)])
    assert out["log"].count("starting over without it") == 3
    assert "template not usable: importing broken3: its import failed (RuntimeError: broken 3) (and 3 entries " \
           "were left out already: broken0, broken1, broken2)" in out["log"]
    assert out["log"].count("spawned: the template is not usable") == 2
    assert set(k["pid"] for k in out["children"]) <= set(out["imports"])  # each child imported heavy itself


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
    @staticmethod
    def device_count():  # torch's NVML-based count (CUDA_VISIBLE_DEVICES honoured)
        return int(os.environ.get("FAKE_VISIBLE", "1"))
    @staticmethod
    def get_device_capability(device=None):  # torch's: device properties, CUDA initialised first
        _C._cuda_init()
        return (7, 5)
    @staticmethod
    def current_device():
        _C._cuda_init()
        return 0
    @staticmethod
    def get_device_name(device=None):
        _C._cuda_init()
        return "from CUDA"
    @staticmethod
    def get_device_properties(device=None):
        _C._cuda_init()
        return type("props", (), {"major": 7, "minor": 5, "name": "from CUDA", "total_memory": 1})()
"""


@pytest.mark.parametrize("module, source, left_out", [
    ("asks_available", "import torch\nOK = torch.cuda.is_available()\n", None),
    ("inits_cuda", "import torch\ntorch._C._cuda_init()\n", "tried to initialise CUDA (torch._C._cuda_init)"),
    ("swallows_it", "import torch\ntry:\n    N = torch._C._cuda_getDeviceCount()\nexcept Exception:\n    N = 0\n",
     "tried to initialise CUDA (torch._C._cuda_getDeviceCount)"),
])
def test_cuda_is_fenced_off_in_the_template(tmp_path, module, source, left_out):
    """A module whose import reaches CUDA through torch is left out (also where it swallows the
    error: what it cached from it is wrong); the template starts over without it and is used."""
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / f"{module}.py").write_text(source)
    cuda_log = tmp_path / "cuda"
    out = run(tmp_path, preload=["torch", module, "heavy"], env={"CUDA_LOG": str(cuda_log)})
    assert not cuda_log.exists()  # nothing reached CUDA in the template: availability came from NVML
    assert out["log"].count("forked from the template") == 2 and len(set(out["imports"])) == 2
    if left_out is None:
        assert "left out" not in out["log"].replace("0 left out (none)", "")
    else:
        assert f"template: {module} left out: its import {left_out}; starting over without it" in out["log"]


FAKE_LIBCUDA = r"""
#include <stdlib.h>
#include <unistd.h>
/* The driver's rule: cuInit in a process forked after its parent's cuInit fails. FAKE_CUDA_HIDDEN=1:
   cuDeviceGetCount never tells (a state no check in the template sees, only the forked test child). */
static pid_t initialised_in = 0;
int cuInit(unsigned int flags) {
    if (initialised_in != 0 && initialised_in != getpid()) return 3;
    initialised_in = getpid();
    return 0;
}
int cuDeviceGetCount(int *count) {
    if (initialised_in == 0 || getenv("FAKE_CUDA_HIDDEN")) return 3;
    *count = 1;
    return 0;
}
"""


@pytest.fixture
def fake_libcuda(tmp_path):
    """A libcuda.so.1 with cuInit and cuDeviceGetCount, found through LD_LIBRARY_PATH."""
    return build_library(tmp_path / "driver", "libcuda.so.1", FAKE_LIBCUDA)


def build_library(folder, soname: str, source: str):
    """A stand-in driver library compiled into `folder` (skipped where no C compiler is)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler for the stand-in {soname}")
    folder.mkdir(exist_ok=True)
    (folder / f"{soname}.c").write_text(source)
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(folder / soname),
                    str(folder / f"{soname}.c")], check=True)
    return folder


FAKE_NVML = r"""
#include <stdlib.h>
#include <string.h>
/* NVML's entry points the template uses; FAKE_NVML_CAPS lists one "major.minor" per GPU of the host. */
static int initialised = 0;
static const char *caps(void) { const char *c = getenv("FAKE_NVML_CAPS"); return c ? c : ""; }
int nvmlInit_v2(void) { initialised++; return 0; }
int nvmlShutdown(void) { if (!initialised) return 1; initialised--; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) {
    const char *c = caps(); *n = *c ? 1 : 0;
    for (; *c; c++) if (*c == ',') (*n)++;
    return initialised ? 0 : 1;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = (void *)(size_t)(i + 1); return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    const char *c = caps();
    for (size_t i = 1; i < (size_t)h; i++) { c = strchr(c, ','); if (!c) return 2; c++; }
    *major = atoi(c); *minor = atoi(strchr(c, '.') + 1);
    return 0;
}
int nvmlDeviceGetName(void *h, char *name, unsigned int length) {  /* FAKE_NVML_ODD: the second differs */
    strncpy(name, (size_t)h == 2 && getenv("FAKE_NVML_ODD") ? "NVIDIA Other" : "NVIDIA H200", length);
    return 0;
}
int nvmlDeviceGetMigMode(void *h, unsigned int *current, unsigned int *pending) {
    if (!getenv("FAKE_NVML_MIG")) return 3; /* NVML_ERROR_NOT_SUPPORTED */
    *current = *pending = 1;
    return 0;
}
"""

ASKS_CAPABILITY = "import torch\nCAPABILITY = torch.cuda.get_device_capability({device})\n"


@pytest.mark.parametrize("gpus, device, visible, left_out", [
    ("9.0,9.0", "", "2", None),
    ("9.0,9.0", "'cuda:1'", "2", None),
    ("9.0,8.0", "", "2", "every GPU not the same"),
    ("9.0,9.0", "3", "2", "a device torch does not see"),
    ("", "", "0", "NVML has no GPU"),
])
def test_the_compute_capability_is_answered_from_nvml_where_every_gpu_has_the_same(
        tmp_path, gpus, device, visible, left_out):
    """SGLang's modules ask torch for the compute capability at import (`is_sm90_supported()`): the
    template answers it from NVML without CUDA where one answer is true for every GPU of the host,
    and leaves the module out where it is not (as CUDA would have been reached)."""
    nvml = build_library(tmp_path / "nvml", "libnvidia-ml.so.1", FAKE_NVML)
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / "asks.py").write_text(ASKS_CAPABILITY.format(device=device))
    cuda_log = tmp_path / "cuda"
    out = run(tmp_path, preload=["torch", "asks", "heavy"], env={
        "CUDA_LOG": str(cuda_log), "LD_LIBRARY_PATH": str(nvml), "FAKE_NVML_CAPS": gpus, "FAKE_VISIBLE": visible})
    assert not cuda_log.exists()
    assert out["log"].count("forked from the template") == 2
    if left_out is None:
        assert ("answered from NVML (every GPU of this host alike) 1 time(s): get_device_capability by asks:2"
                in out["log"])
        assert "NVML shut down 1 time(s)" in out["log"]  # its own initialisation is undone before a fork
    else:
        assert ("template: asks left out: its import tried to initialise CUDA "
                "(torch.cuda.get_device_capability); starting over without it") in out["log"], left_out
        assert "answered from NVML" not in out["log"]


ASKS_LIKE_SGL_KERNEL = """import torch
device = torch.cuda.current_device()
properties = torch.cuda.get_device_properties(device)
CAPABILITY = properties.major * 10 + properties.minor
{extra}
"""


@pytest.mark.parametrize("extra, env, refused", [
    ("", {}, None),
    ("NAME = torch.cuda.get_device_name(0)", {}, None),
    ("NAME = properties.name", {}, None),
    ("MEMORY = properties.total_memory", {}, "torch.cuda.get_device_properties().total_memory"),
    ("NAME = torch.cuda.get_device_name(0)", {"FAKE_NVML_ODD": "1"}, "torch.cuda.get_device_name"),
    ("NAME = torch.cuda.get_device_name(0)", {"FAKE_NVML_MIG": "1"}, "torch.cuda.get_device_name"),
])
def test_what_sgl_kernel_and_triton_ask_is_answered_from_nvml_and_nothing_else(tmp_path, extra, env, refused):
    """sgl_kernel picks its build by the current device's properties (major, minor) and SGLang's
    fla utils by the device name: answered where every GPU of the host is alike (a name not where one
    differs or MIG splits them), any other property refused as CUDA would be reached."""
    nvml = build_library(tmp_path / "nvml", "libnvidia-ml.so.1", FAKE_NVML)
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / "asks.py").write_text(ASKS_LIKE_SGL_KERNEL.format(extra=extra))
    cuda_log = tmp_path / "cuda"
    out = run(tmp_path, preload=["torch", "asks", "heavy"], env={
        "CUDA_LOG": str(cuda_log), "LD_LIBRARY_PATH": str(nvml), "FAKE_NVML_CAPS": "9.0,9.0", "FAKE_VISIBLE": "2",
        **env})
    assert not cuda_log.exists()
    assert out["log"].count("forked from the template") == 2
    if refused is None:
        assert "current_device by asks:2, get_device_properties by asks:3" in out["log"]
        assert "left out:" not in out["log"]
    else:
        assert (f"template: asks left out: its import tried to initialise CUDA ({refused}); starting over "
                "without it") in out["log"]


KEEPS_IT = ("import torch\nask = torch.cuda.get_device_capability  # kept under its own name\nAT_IMPORT = ask()\n"
            "PROPERTIES = torch.cuda.get_device_properties(0)  # kept: NVML's major and minor\n")


def test_a_module_that_keeps_the_function_gets_torch_s_own_answer_after_the_imports(tmp_path):
    """The answer is the template's only while it imports: a module holding on to the function asks
    torch (and CUDA) later, in the child, as it would have without the fast start."""
    nvml = build_library(tmp_path / "nvml", "libnvidia-ml.so.1", FAKE_NVML)
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / "keeps.py").write_text(KEEPS_IT)
    cuda_log = tmp_path / "cuda"
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from dflash_faststart import preload; "
            "state = preload(['torch', 'keeps']); import keeps; "
            "print(json.dumps([keeps.AT_IMPORT, keeps.ask(), state['capability'], state['ok'], "
            "keeps.PROPERTIES.major, keeps.PROPERTIES.total_memory]))")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), CUDA_LOG=str(cuda_log), LD_LIBRARY_PATH=str(nvml),
               FAKE_NVML_CAPS="9.0", FAKE_VISIBLE="1")
    r = subprocess.run([sys.executable, "-c", code, str(kernels.HOOK_DIR)], env=env, capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    at_import, later, said, ok, major, memory = json.loads(r.stdout.splitlines()[-1])
    assert at_import == [9, 0] and later == [7, 5] and ok
    assert "2 time(s): get_device_capability by keeps:3, get_device_properties by keeps:4" in said
    assert major == 9 and memory == 1  # what NVML answered stays; the rest is torch's, asked now
    assert cuda_log.read_text() == "init\ninit\n"  # torch's own, after the imports only


CALLS_CUINIT = "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\n"


def test_a_module_that_initialises_the_driver_itself_is_left_out(tmp_path, fake_libcuda):
    """No fence sees a library calling cuInit directly: the check after each import does."""
    (tmp_path / "calls_cuinit.py").write_text(CALLS_CUINIT)
    out = run(tmp_path, preload=["calls_cuinit", "heavy"], env={"LD_LIBRARY_PATH": str(fake_libcuda)})
    assert ("template: calls_cuinit left out: its import initialised CUDA in the driver (cuDeviceGetCount "
            "answered 0); starting over without it") in out["log"]
    assert "a forked test child: CUDA initialised in it" in out["log"]  # the driver works in a fork of it
    assert out["log"].count("forked from the template") == 2


def test_a_template_whose_fork_cannot_use_cuda_is_refused(tmp_path, fake_libcuda):
    """Whatever the checks in the template miss, the child forked from it before it is used must
    initialise CUDA; here it cannot (CUDA was initialised unseen), so both children are spawned."""
    (tmp_path / "calls_cuinit.py").write_text(CALLS_CUINIT)
    out = run(tmp_path, preload=["calls_cuinit", "heavy"],
              env={"LD_LIBRARY_PATH": str(fake_libcuda), "FAKE_CUDA_HIDDEN": "1"})
    assert ("template not usable: a child forked from the template could not initialise CUDA (cuInit "
            "answered 3)") in out["log"]
    assert out["log"].count("spawned: the template is not usable") == 2 and len(out["imports"]) == 4


STARTS_A_THREAD = """
import os, threading
stop = threading.Event()
worker = threading.Thread(target=stop.wait, name="pool")
worker.start()
if os.environ.get("STOP_BEFORE_FORK"):  # OpenBLAS (numpy) stops its thread pool before a fork so
    os.register_at_fork(before=lambda: (stop.set(), worker.join()))
"""


@pytest.mark.parametrize("stops_before_fork", [True, False])
def test_threads_that_a_fork_would_leave_behind(tmp_path, stops_before_fork):
    (tmp_path / "pool.py").write_text(STARTS_A_THREAD)
    env = {"STOP_BEFORE_FORK": "1"} if stops_before_fork else {}
    out = run(tmp_path, preload=["heavy", "pool"], env=env, program=PROGRAM.replace(
        "import heavy\n", "import heavy, pool\npool.stop.set()\n", 1))
    if stops_before_fork:
        assert out["log"].count("forked from the template") == 2
    else:
        assert "template not usable: 2 threads run after the imports" in out["log"]
        assert out["log"].count("spawned: the template is not usable") == 2


JEMALLOC_CHILD = '''    junk = [bytearray(65536) for _ in range(2000)]  # jemalloc at work, as in a scheduler
    del junk
    time.sleep(0.5)
    threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    writer.send({"threads": threads, "pid"'''

# A library with its own jemalloc (a copy of Debian's under another name, loaded RTLD_LOCAL as an
# extension module's dependency is): its mallctl is nowhere the template can reach it.
BUNDLED_JEMALLOC = """
import ctypes, os
lib = ctypes.CDLL(os.environ["BUNDLED_ALLOCATOR"])
lib.malloc.restype, lib.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
lib.free(lib.malloc(1 << 20))  # its first allocation starts its background thread, soon after
for _ in range(500):
    if "jemalloc_bg_thd" in [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]:
        break
    __import__("time").sleep(0.01)
"""


def jemalloc_run(tmp_path, env, preload=("heavy",)):
    program = PROGRAM.replace('    writer.send({"pid"', JEMALLOC_CHILD).replace("import json,", "import json, time,")
    return run(tmp_path, preload=preload, env=env, program=program)


def test_jemalloc_s_background_thread_is_left_to_jemalloc_and_turned_back_on_in_each_child(tmp_path):
    """GPU images run jemalloc with its background thread on (`jemalloc_bg_thd`, seen on the H200).
    jemalloc's own fork handlers make a fork safe and leave the child without it: the template forks
    all the same, and each child turns it back on, running the threads a spawned child would."""
    env = {"LD_PRELOAD": str(jemalloc_or_skip()), "MALLOC_CONF": "background_thread:true"}
    out = jemalloc_run(tmp_path, env)
    assert out["log"].count("forked from the template") == 2, out["log"]
    assert ("jemalloc's background thread (1) left to jemalloc's own fork handling: off in each forked child, "
            "turned back on there;") in out["log"]
    assert all("jemalloc_bg_thd" in k["threads"] for k in out["children"]), out["children"]
    # the same jemalloc with its thread off from the start: nothing to leave, nothing turned on
    out = jemalloc_run(tmp_path, dict(env, MALLOC_CONF="background_thread:false"))
    assert out["log"].count("forked from the template") == 2, out["log"]
    assert "jemalloc's background thread" not in out["log"]
    assert all("jemalloc_bg_thd" not in k["threads"] for k in out["children"])


def test_a_library_s_own_jemalloc_does_not_stop_the_fork(tmp_path):
    bundled = tmp_path / "libbundled.so"
    shutil.copyfile(jemalloc_or_skip(), bundled)
    (tmp_path / "bundled.py").write_text(BUNDLED_JEMALLOC)
    env = {"BUNDLED_ALLOCATOR": str(bundled), "MALLOC_CONF": "background_thread:true",
           "GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=16384"}  # its TLS, loaded after start
    out = jemalloc_run(tmp_path, env, preload=["heavy", "bundled"])
    assert out["log"].count("forked from the template") == 2, out["log"]
    assert ("jemalloc's background thread (1) left to jemalloc's own fork handling: off in each forked child, "
            "left off there (its mallctl is not reachable);") in out["log"]
    assert all(k["threads"].count("jemalloc_bg_thd") == 0 for k in out["children"])


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


def test_the_default_is_on_for_one_gpu_only():
    """null (the default): measured on the H200 and an H100 at tp 1 only; an explicit value decides."""
    assert faststart.wanted(None, 1) is True
    assert faststart.wanted(None, 2) is False and faststart.wanted(None, 8) is False
    assert faststart.wanted(False, 1) is False and faststart.wanted(True, 2) is True


def test_doctor_tries_it_in_the_interpreter():
    """With the list an instance uses (here: what of it this venv has)."""
    r = probes.run_probe(sys.executable, "faststart", faststart.probe_arg(), timeout=120)
    check = faststart.check(r)
    assert check.status == "ok", (r, check)
    assert check.summary.startswith("available, on by default for instances of one GPU (tpSize 1; fastStart = false turns it off, true turns it on for tpSize > 1): a template imported ")
    assert r["facts"]["preloaded"] > 0 and r["facts"]["fork_probe"] == "no CUDA driver to try"
    broken = faststart.check({"ok": True, "facts": {"ok": False, "why": "prctl is not available (x)"}})
    assert broken.status == "warn" and "prctl is not available" in broken.summary
    assert "CPython 3.10 to 3.13" in broken.fix
    failed = faststart.check({"ok": False, "error": "cannot run /nope"})
    assert failed.status == "warn" and "cannot run /nope" in failed.summary


def test_doctor_names_why_the_template_is_refused(tmp_path, fake_libcuda):
    (tmp_path / "calls_cuinit.py").write_text(CALLS_CUINIT)
    (tmp_path / "list.json").write_text(json.dumps({"preload": ["calls_cuinit", "json"]}))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), LD_LIBRARY_PATH=str(fake_libcuda), FAKE_CUDA_HIDDEN="1")
    r = probes.run_probe(sys.executable, "faststart", json.dumps([str(kernels.HOOK_DIR), str(tmp_path / "list.json")]),
                         timeout=120, env=env)
    check = faststart.check(r)
    assert check.status == "warn", (r, check)
    assert check.summary.startswith("not usable here: the template is not usable: a child forked from the "
                                    "template could not initialise CUDA (cuInit answered 3); where the fast "
                                    "start is on, SGLang spawns its children as before")
    assert "set fastStart = false here" in check.fix


def test_the_template_dies_with_the_server_even_while_it_imports(tmp_path):
    """PR_SET_PDEATHSIG: a server that exits (or is killed) leaves no template importing on."""
    (tmp_path / "stuck_import.py").write_text(
        "import os, time\nopen(os.environ['STUCK_PIDFILE'], 'w').write(str(os.getpid()))\ntime.sleep(3600)\n")
    (tmp_path / "list.json").write_text(json.dumps({"preload": ["stuck_import"]}))
    pidfile = tmp_path / "template.pid"
    (tmp_path / "server.py").write_text(
        "import os, sys, time\n"
        "while not (os.path.exists(sys.argv[1]) and open(sys.argv[1]).read()):\n"
        "    time.sleep(0.05)\n")
    env = {k: v for k, v in os.environ.items() if k != faststart.ENV}
    env.update(PYTHONPATH=str(kernels.HOOK_DIR), STUCK_PIDFILE=str(pidfile),
               **{faststart.ENV: str(tmp_path / "list.json")})
    subprocess.run([sys.executable, str(tmp_path / "server.py"), str(pidfile)], env=env, timeout=120,
                   cwd=tmp_path, check=True)
    template = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{template}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            break  # gone
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the template {template} outlived its server")
