"""`dflashctl kernels build|status`: SGLang's JIT kernels compiled ahead, without a GPU, and used read-only.

`build` runs SGLang's own module loaders (`calls_for`, with each model's shapes) in the stack's
interpreter once per CUDA arch, with no GPU visible and `override_jit_cuda_arch` naming the arch;
kernel_hook/dflash_kernel_hook.py copies every module tvm-ffi builds into `--out` under tvm-ffi's
own key, with the headers' digest and the arch list. `index.json` there says which calls were built
for which arch. At run time `provide(env)` puts the hook first on the SGLang child's PYTHONPATH when
$DFLASH_PREBUILT_KERNELS names such a directory: a module found there is loaded as it is, anything
else compiles into the writable TVM_FFI_CACHE_DIR as before. Triton's kernels, known only from a
recording made on a GPU, are built by triton_kernels.py into the same directory's `triton/`.
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dflashctl import cli_help, inputs, output
from dflashctl.errors import CONFIG, FAILED, INPUT, USAGE, DflashError
from dflashctl.host import cuda_home, jit_caches, probes, sglang_0_5_11, triton_kernels
from dflashctl.host.kernel_hook import dflash_kernel_hook as hook

HOOK_DIR = Path(hook.__file__).resolve().parent
PREBUILT_ENV = hook.PREBUILT_ENV
INDEX = "index.json"
INDEX_FORMAT = 1
DEFAULT_ARCHS = ["sm90", "sm100", "sm120"]  # H100/H200, B200, RTX PRO 6000 Blackwell
# The smoke's synthetic target (smoke/synthetic.py; tests/host/test_kernels.py keeps the two equal).
SMOKE_TARGET = {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
                "hidden_size": 1024, "torch_dtype": "bfloat16"}
# The smoke's default pair (smoke/oracle.py): 16 KV heads, so its KV-cache store differs.
ORACLE_TARGET = {**SMOKE_TARGET, "num_key_value_heads": 16}
# Every target the default smoke starts: the oracle pair's, and the random-weight one its grammar
# server runs (tests/host/test_kernels.py holds both to the smoke's own configs).
SMOKE_TARGETS = {"smoke's oracle target": ORACLE_TARGET, "smoke's synthetic target": SMOKE_TARGET}


# SGLang's JIT module loaders a model calls, with its shapes (host/sglang_0_5_11.py)
calls_for = sglang_0_5_11.jit_calls


def arch_version(arch: str) -> str:
    """`sm90` / `sm_90` / `9.0` -> `9.0` (the form TVM_FFI_CUDA_ARCH_LIST and torch use)."""
    a = arch.strip().lower().replace("sm_", "").replace("sm", "")
    if "." in a:
        major, _, minor = a.partition(".")
    else:
        major, minor = a[:-1], a[-1:]
    if not (major.isdigit() and minor.isdigit()):
        raise DflashError(f"unknown CUDA arch {arch!r}", "", "name archs as sm90, sm100, sm120 (or 9.0)", CONFIG)
    return f"{int(major)}.{int(minor)}"


# The children, real modules run as `python -c SOURCE ...` in the stack's interpreter (jit_child.py,
# flashinfer_norm_child.py say how): the interpreter needs no dflashctl.
JIT_CHILD = Path(__file__).with_name("jit_child.py").read_text()
FLASHINFER_CHILD = Path(__file__).with_name("flashinfer_norm_child.py").read_text()
FLASHINFER_AOT = "flashinfer-aot"


def libcuda_stub(env: dict[str, str], scratch: Path, always: bool = False) -> Path | None:
    """flashinfer links its modules with -lcuda from $CUDA_HOME/lib64/stubs, which the stack's CUDA
    wheels do not have and a build machine without a driver lacks, and Triton's helper modules with
    -l:libcuda.so.1 (`always`): an empty libcuda.so with the driver's soname (and that name), for the
    link only (the module then needs the driver's libcuda.so.1, found at run time)."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda"
    if not always and Path(home, "lib64", "stubs", "libcuda.so").exists():
        return None
    cc = env.get("CC") or "cc"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "stub.c").write_text("/* link-time stand-in for the NVIDIA driver's libcuda */\n")
    p = subprocess.run([cc, "-shared", "-Wl,-soname,libcuda.so.1", "-o", str(scratch / "libcuda.so"),
                        str(scratch / "stub.c")], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise DflashError("cannot make the libcuda link stub the prebuilt modules need", p.stderr.strip(),
                          f"install a C compiler ({cc}) or set CUDA_HOME to a toolkit with lib64/stubs", FAILED)
    (scratch / "libcuda.so.1").unlink(missing_ok=True)
    (scratch / "libcuda.so.1").symlink_to("libcuda.so")
    return scratch


def build_flashinfer_norm(python: str, out: Path, archs: list[str], env: dict[str, str],
                          timeout: float = 1800.0) -> dict:
    """flashinfer's `norm` module as one fat binary for `archs` into `out`/flashinfer-aot/norm/."""
    versions = [arch_version(a) for a in archs]
    child_env = cuda_home.provide(dict(env), python)
    child_env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(prefix="dflash-flashinfer-") as staging:
        child_env["FLASHINFER_WORKSPACE_BASE"] = staging
        stub = libcuda_stub(child_env, Path(staging))
        if stub:
            child_env["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{stub}"
        p = subprocess.run([python, "-c", FLASHINFER_CHILD, " ".join(versions), str(out.resolve())],
                           env=child_env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    try:
        done = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DflashError(f"flashinfer's norm module did not build (exit {p.returncode})",
                          "its output ends with:\n" + "\n".join(p.stderr.strip().splitlines()[-15:]),
                          "it needs cuBLAS and cuRAND headers beside nvcc (the stack's nvidia wheels); "
                          "--no-flashinfer-norm skips it", FAILED)
    record = {"format": INDEX_FORMAT, "archs": versions, "flashinfer": done["flashinfer"],
              "modules": [done["module"]]}
    output.write(out / FLASHINFER_AOT / hook.RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n", "--out")
    return record


def provide(env: dict[str, str]) -> dict[str, str]:
    """`env` with the prebuilt-kernel hook first on PYTHONPATH when $DFLASH_PREBUILT_KERNELS is set,
    and Triton's cache manager the prebuilt layer when that directory has Triton kernels (or Triton's
    kernels are being recorded, $DFLASH_TRITON_RECORD)."""
    env = dict(env)
    root, recording = env.get(PREBUILT_ENV), env.get(triton_kernels.RECORD_ENV)
    if not root and not recording:
        return env
    if root and jit_caches.same_dir(env.get("TVM_FFI_CACHE_DIR"), root):
        raise DflashError(f"TVM_FFI_CACHE_DIR and {PREBUILT_ENV} are both {root}",
                          "the prebuilt directory is read-only; tvm-ffi would wait forever on its lock",
                          "leave TVM_FFI_CACHE_DIR unset (it then lives in the instance's cache directory)",
                          CONFIG)
    if root and jit_caches.same_dir(env.get("TRITON_CACHE_DIR"), Path(root, triton_kernels.SUBDIR)):
        raise DflashError(f"TRITON_CACHE_DIR is the prebuilt directory's {triton_kernels.SUBDIR}/",
                          "Triton writes into its cache directory, and the prebuilt one is read-only",
                          "leave TRITON_CACHE_DIR unset (it then lives in the instance's cache directory)",
                          CONFIG)
    env = hook_on_path(env)
    if recording or Path(root, triton_kernels.SUBDIR).is_dir():
        env.setdefault("TRITON_CACHE_MANAGER", triton_kernels.MANAGER)
    if root and Path(root, FLASHINFER_AOT, "norm", "norm.so").exists():
        # With nvidia-cutlass-dsl installed flashinfer would take its CuTe-DSL RMSNorm and compile
        # that at the first start; the prebuilt nvcc build needs no compiler (docs/benchmarks.md).
        env.setdefault("FLASHINFER_USE_CUDA_NORM", "1")
    return env


def hook_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with the stack's start-up hook (kernel_hook/: its sitecustomize) first on PYTHONPATH,
    once, for the prebuilt kernels and the fast start alike."""
    env = dict(env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(HOOK_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR)] + parts)
    return env


def write_index(out: Path, index: dict) -> None:
    """Replaced in one step (output.write): a reader never sees half an index."""
    output.write(out / INDEX, json.dumps(index, indent=1, sort_keys=True) + "\n", "--out")


def read_index(root: str | Path) -> dict | None:
    try:
        index = json.loads(Path(root, INDEX).read_text())
    except (OSError, ValueError):
        return None
    return index if index.get("format") == INDEX_FORMAT else None


def coverage(root: str | Path, arch: str, configs: dict[str, dict]) -> tuple[bool, str]:
    """Whether `root` holds every kernel each model in `configs` (label -> config.json) needs on
    `arch`; (covered, one line saying what is missing)."""
    index = read_index(root)
    if index is None:
        return False, f"{root} holds no {INDEX} of `dflashctl kernels build`"
    built = index.get("built", {}).get(arch_version(arch))
    if built is None:
        archs = ", ".join(sorted(index.get("built", {}))) or "none"
        return False, f"not built for compute capability {arch_version(arch)} (built: {archs})"
    missing = {label: [c for c in calls_for(cfg) if c not in built] for label, cfg in configs.items()}
    missing = {label: m for label, m in missing.items() if m}
    if missing:
        text = "; ".join(f"{label}: {len(m)} of {len(calls_for(configs[label]))} modules "
                         f"(first {m[0][1]}{tuple(m[0][2])})" for label, m in missing.items())
        return False, f"compute capability {arch_version(arch)} is built, but not every shape: {text}"
    triton = index.get("triton", {}).get(arch_version(arch))
    triton_text = (f", {len(triton)} Triton kernel(s){_carried_text(index, arch)}" if triton else
                   ", no Triton kernels (they compile at the first start)")
    return True, (f"compute capability {arch_version(arch)}, {len(configs)} model shape(s): every "
                  f"module prebuilt{triton_text}")


def calls_of(configs: dict[str, dict]) -> list[list]:
    calls: list[list] = []
    for cfg in configs.values():
        calls += [c for c in calls_for(cfg) if c not in calls]
    return calls


def doctor_check(root: str | None, torch_probe: dict, configs: dict[str, dict]) -> probes.Check:
    """Doctor's `prebuilt-kernels` line: does `root` cover each visible GPU's arch and `configs`?"""
    name = "prebuilt-kernels"
    if not root:
        return probes.warn(name, f"none (${PREBUILT_ENV} is not set): a first start compiles SGLang's "
                                 "JIT kernels, about a minute",
                           f"dflashctl kernels build --out DIR (the flake's dflash-kernels package), then "
                           f"{PREBUILT_ENV}=DIR")
    caps = sorted({g["compute_capability"] for g in (torch_probe.get("facts") or {}).get("gpus", [])})
    if not caps:
        return probes.warn(name, f"{root}: no GPU visible to compare its arch with", "run doctor on the GPU host")
    lines, covered = [], True
    for cap in caps:
        ok, text = coverage(root, cap, configs)
        covered &= ok
        lines.append(text)
    summary = f"{root}: " + "; ".join(lines)
    if covered:
        return probes.ok(name, summary, archs=caps, models=sorted(configs))
    return probes.warn(name, summary + " (what is missing compiles at the first start)",
                       "add the arch or model to the kernel build (dflashctl kernels build --arch SM "
                       "--model-config PATH)", archs=caps, models=sorted(configs))


def build(python: str, out: Path, archs: list[str], calls: list[list], env: dict[str, str],
          timeout: float = 1800.0, say=print) -> dict:
    """Compile every call (module, loader, args) for every arch into `out`; the index it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    index = read_index(out) or {"format": INDEX_FORMAT, "built": {}}
    child_env = cuda_home.provide(dict(env), python)
    child_env.update({"CUDA_VISIBLE_DEVICES": "", hook.RECORD_ENV: str(out.resolve())})
    child_env.pop(PREBUILT_ENV, None)
    child_env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR)] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    failures = []
    for arch in map(arch_version, archs):
        with tempfile.TemporaryDirectory(prefix="dflash-kernels-") as staging:
            child_env["TVM_FFI_CACHE_DIR"] = staging  # tvm-ffi's own builds; the hook copies the .so out
            started = time.monotonic()
            p = subprocess.run([python, "-c", JIT_CHILD, "build", json.dumps(calls), arch], env=child_env,
                               capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        try:
            results = json.loads(p.stdout.strip().splitlines()[-1])["calls"]
        except (ValueError, IndexError, KeyError, TypeError):
            raise DflashError(f"the kernel build for {arch} exited with status {p.returncode}",
                              "its output ends with:\n" + "\n".join(p.stderr.strip().splitlines()[-15:]),
                              f"check that {python} has SGLang and tvm-ffi and that nvcc and c++ work", FAILED)
        ok = [r["call"] for r in results if r["ok"]]
        absent = [r for r in results if "ModuleNotFoundError" in r.get("error", "")]
        if not ok and results and len(absent) == len(results):
            raise DflashError(f"{python} cannot import SGLang's JIT loaders, so nothing was built",
                              absent[0]["error"][:300],
                              "pass --python the stack's interpreter (the one with SGLang and tvm-ffi: "
                              "/opt/dflash/bin/python, or the Nix package's bin/python)", FAILED)
        index["built"][arch] = sorted(ok + [c for c in index["built"].get(arch, []) if c not in ok])
        failures += [(arch, r) for r in results if not r["ok"]]
        say(f"kernels: {arch}: {len(ok)}/{len(results)} modules in {time.monotonic() - started:.0f} s")
    index["archs"] = sorted(index["built"], key=lambda a: tuple(map(int, a.split("."))))
    write_index(out, index)
    if failures:
        raise not_built(failures, "kernel module(s)", lambda r: f"{r['call'][1]}{tuple(r['call'][2])}")
    return index


def not_built(failures: list[tuple[str, dict]], what: str, name_of) -> DflashError:
    """The error for a build in which some of `what` failed: (arch, result) pairs, the first named."""
    arch, first = failures[0]
    return DflashError(f"{len(failures)} {what} did not build (first: {arch} {name_of(first)})",
                       first.get("error", "") or "no error was reported",
                       "fix what the first failure says and build again; what did build is in the index "
                       "and is used", FAILED)


def build_triton(python: str, out: Path, archs: list[str], record_files: list[str], smoke: bool,
                 env: dict[str, str]) -> None:
    """Triton's recorded kernels for each arch into `out`/triton, noted in the index: each arch's
    own records, and those of the other archs carried to it where they can be (triton_kernels.carry)."""
    index = read_index(out) or {"format": INDEX_FORMAT, "built": {}}
    failed = []
    archs = [arch_version(a) for a in archs]
    files = [Path(f) for f in record_files] + (triton_kernels.shipped_records() if smoke else [])
    records = triton_kernels.read_records(files)  # each record names its arch; build takes that arch's
    if not records:
        return
    with tempfile.TemporaryDirectory(prefix="dflash-libcuda-") as scratch:
        stub = libcuda_stub(env, Path(scratch), always=True)
        for arch in archs:
            started = time.monotonic()
            carried, left_out = triton_kernels.carry(records, arch)
            done = triton_kernels.build(python, out, arch, records + carried, env, stub)
            if not any(done.values()):
                continue
            if done["stale"]:
                print(f"kernels: {arch}: {len(done['stale'])} recorded Triton kernel(s) left out, stale "
                      f"(first {done['stale'][0]['kernel']}: {done['stale'][0]['error']}); they compile at "
                      "the first start. Record them again with this stack: DFLASH_TRITON_RECORD=FILE",
                      file=sys.stderr, flush=True)
            triton = index.setdefault("triton", {})
            triton[arch] = sorted(set(done["built"]) | set(triton.get(arch, [])))
            if carried or left_out:
                index.setdefault("triton_carried", {})[arch] = {
                    "from": sorted({_arch_of(c["carried_from"]["arch"]) for c in carried}
                                   | {_arch_of(x["from"]) for x in left_out}),
                    "kernels": done["carried"], "left_out": left_out}
            failed += [(arch, r) for r in done["failed"]]
            print(f"kernels: {arch}: Triton {len(done['built'])}/{sum(len(v) for k, v in done.items() if k != 'carried')} "
                  f"kernels in {time.monotonic() - started:.0f} s{_carried_text(index, arch)}", file=sys.stderr, flush=True)
    write_index(out, index)
    if failed:
        raise not_built(failed, "recorded Triton kernel(s)", lambda r: r.get("kernel") or r.get("helper"))


def _arch_of(cap: int) -> str:
    return f"{cap // 10}.{cap % 10}"


def _carried_text(index: dict, arch: str) -> str:
    """What of `arch`'s Triton kernels came from another arch's recording, and what did not."""
    c = (index.get("triton_carried") or {}).get(arch_version(arch))
    if not c:
        return ""
    names = sorted({x["kernel"].rsplit(".", 1)[-1] for x in c["left_out"]})
    left = (f"; {len(c['left_out'])} left out, their specialisation depends on the GPU "
            f"({', '.join(names)}): they compile at the first start") if c["left_out"] else ""
    return f" ({len(c['kernels'])} carried over from the {', '.join(c['from'])} recording{left})"


def read_config(path: str) -> dict:
    p = Path(path)
    p = p / "config.json" if os.path.isdir(p) else p
    data = inputs.read_json(p, "model config", "pass --model-config a model directory or its config.json",
                            CONFIG, 16 << 20)
    if not isinstance(data, dict):
        raise DflashError(f"{p} is not a model config", "a config.json is a JSON object",
                          "pass --model-config a model directory or its config.json", CONFIG)
    for key in SHAPE_KEYS:  # calls_for computes with them
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise DflashError(f"{p} is not a model config", f"{key} must be a positive integer, not "
                              f"{json.dumps(value)[:40]}",
                              "pass --model-config a model directory or its config.json", CONFIG)
    return data


SHAPE_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size")


def model_configs(paths: list[str], smoke: bool) -> dict[str, dict]:
    configs = {p: read_config(p) for p in paths}
    if smoke or not configs:
        configs.update({name: dict(c) for name, c in SMOKE_TARGETS.items()})
    return configs


def register(subparsers) -> None:
    p = subparsers.add_parser("kernels", help="SGLang's JIT kernels built ahead (no GPU needed), used read-only",
                              **cli_help.texts("kernels", __doc__))
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="compile the kernels for named archs and model shapes into a directory",
                       **cli_help.texts("kernels", "Compile SGLang's JIT kernels (and flashinfer's norm, and "
                                        "recorded Triton kernels) for named archs and model shapes into a "
                                        "directory, with no GPU."))
    b.add_argument("--out", required=True, metavar="DIR", help="the prebuilt directory (DFLASH_PREBUILT_KERNELS)")
    s = sub.add_parser("status", help="whether a prebuilt directory covers an arch and model shapes",
                       **cli_help.texts("kernels", "Whether a prebuilt directory (`kernels build --out DIR`) "
                                        "holds every kernel an arch and the model shapes need; builds nothing."))
    s.add_argument("--dir", metavar="DIR", default=os.environ.get(PREBUILT_ENV),
                   help=f"the prebuilt directory (default ${PREBUILT_ENV})")
    for q, verb in ((b, "build"), (s, "look for")):
        q.add_argument("--arch", action="append", metavar="SM",
                       help="CUDA arch, repeatable (default: " + (" ".join(DEFAULT_ARCHS) if q is b else
                                                                  "the archs the directory was built for") + ")")
        q.add_argument("--model-config", action="append", default=[], metavar="PATH",
                       help=f"a model directory or config.json whose shapes to {verb} (repeatable)")
        q.add_argument("--smoke", action="store_true",
                       help=f"also {verb} the smoke's targets" + (" and its recorded Triton kernels" if q is b
                                                                   else "") + " (the default when no "
                       "--model-config is given)")
    b.add_argument("--python", default=sys.executable, help="the stack's interpreter (default: this one)")
    b.add_argument("--no-flashinfer-norm", dest="flashinfer_norm", action="store_false",
                   help="skip flashinfer's RMSNorm module (built by default, one binary for every arch)")
    b.add_argument("--triton-record", action="append", default=[], metavar="FILE",
                   help="Triton kernels recorded on a GPU host (DFLASH_TRITON_RECORD=FILE), repeatable; "
                        "--smoke adds the smoke's own recordings")
    p.set_defaults(func=run)


def check_python(python: str) -> None:
    if not python or not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise DflashError(f"--python {python!r} is not an interpreter", "no executable file there",
                          "pass --python the stack's interpreter (e.g. /opt/dflash/bin/python)", CONFIG)


def run(args) -> int:
    # Every argument is checked before anything is made or built.
    configs = model_configs(args.model_config, args.smoke)
    archs = [arch_version(a) for a in (args.arch or ([] if args.action == "status" else DEFAULT_ARCHS))]
    if args.action == "build":
        check_python(args.python)
        for f in args.triton_record:
            if not triton_kernels.read_records([Path(f)]):
                raise DflashError(f"{f} holds no Triton kernel records", "no line is a record of this stack's "
                                  "hook (DFLASH_TRITON_RECORD)", "record it on a GPU host: "
                                  "DFLASH_TRITON_RECORD=FILE dflashctl smoke (docs/smoke.md)", CONFIG)
        out = output.check_dir(args.out, "--out")
        made = not out.exists()
        try:
            build_all(args, out, configs)
        except DflashError:
            if made and out.is_dir() and not any(out.iterdir()):
                out.rmdir()  # a build that made nothing leaves nothing
            raise
        print(f"kernels: {out} holds {len(list(out.glob('*/' + hook.RECORD)))} prebuilt modules; "
              f"use it with {PREBUILT_ENV}={out.resolve()}")
        return 0
    if not args.dir:
        raise DflashError("no prebuilt kernel directory given", "",
                          f"pass --dir DIR or set {PREBUILT_ENV}", USAGE)
    if not os.path.isdir(args.dir):
        raise DflashError(f"{args.dir!r} is not a prebuilt kernel directory",
                          "it does not exist" if not os.path.lexists(args.dir) else "it is not a directory",
                          f"pass --dir the directory `dflashctl kernels build --out DIR` made", INPUT)
    covered = True
    archs = archs or (read_index(args.dir) or {}).get("archs") or []
    if read_index(args.dir) is None:
        raise DflashError(f"{args.dir} holds no {INDEX} of `dflashctl kernels build`", "",
                          f"build it: dflashctl kernels build --out {shlex.quote(args.dir)}", INPUT)
    for arch in archs:
        ok, text = coverage(args.dir, arch, configs)
        covered &= ok
        print(f"{'ok' if ok else 'miss':<4}  {text}")
    return 0 if covered else FAILED


def build_all(args, out: Path, configs: dict[str, dict]) -> None:
    archs = args.arch or DEFAULT_ARCHS
    build(args.python, out, archs, calls_of(configs), dict(os.environ),
          say=lambda t: print(t, file=sys.stderr, flush=True))
    if args.flashinfer_norm:
        started = time.monotonic()
        done = build_flashinfer_norm(args.python, out, archs, dict(os.environ))
        print(f"kernels: flashinfer {done['flashinfer']} norm for {' '.join(done['archs'])} in "
              f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    # the smoke's recorded Triton kernels come with its shapes (model_configs' rule)
    build_triton(args.python, out, archs, args.triton_record, args.smoke or not args.model_config,
                 dict(os.environ))
