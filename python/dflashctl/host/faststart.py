"""The fast start: SGLang's children forked from a template that imported their libraries once.

The mechanism runs inside SGLang's processes (kernel_hook/dflash_faststart.py, standard library
only; docs/INTERNALS.md, "The fast start"). Here: `provide(env, on)` gives the SGLang child's
environment the start-up hook and $DFLASH_FASTSTART (the preload list shipped for SGLang 0.5.11,
data/sglang-0.5.11-preload.json, or a list the instance's `environment` names) when the fast start
is on for the instance, or takes it away when off; `wanted` is that decision: the instance's
`fastStart`, or where it is null (the default), on for an instance of one GPU, where the H200 and an
H100 measured it (docs/benchmarks.md), off for tensor parallelism, not yet measured (forked
schedulers forming their NCCL group across GPUs); `check` is doctor's `faststart` line from the
stack's interpreter trying it once with that list (probe_child.probe_faststart).
"""

import json
from pathlib import Path

from dflashctl.host import kernels, probes, sglang_0_5_11
from dflashctl.host.kernel_hook import dflash_faststart as hook

ENV = hook.ENV
PRELOAD = Path(__file__).resolve().parent / "data" / sglang_0_5_11.FASTSTART_PRELOAD
SETTING = "fastStart"


def wanted(setting: bool | None, tp_size: int) -> bool:
    """Whether an instance starts with the fast start: its `fastStart`, else on at tpSize 1 only."""
    return setting if setting is not None else tp_size == 1


def provide(env: dict[str, str], on: bool) -> dict[str, str]:
    """`env` for SGLang with the fast start on (the hook on PYTHONPATH, $DFLASH_FASTSTART naming the
    preload list unless the instance's environment names its own or "0") or off (no variable)."""
    env = dict(env)
    if not on:
        env.pop(ENV, None)
        return env
    env.setdefault(ENV, str(PRELOAD))
    return kernels.hook_on_path(env) if env[ENV] != "0" else env


def probe_arg() -> str:
    """What doctor's probe gets: the hook's directory and the preload list an instance would use."""
    return json.dumps([str(kernels.HOOK_DIR), str(PRELOAD)])


def check(r: dict) -> probes.Check:
    """ok: a template imported the list here without touching CUDA and a child forked from it came
    back as this process's own; warn with why not (with fastStart on, SGLang would then spawn its
    children as before: slower, nothing else changes)."""
    f = r.get("facts", {})
    left_out = ", ".join(e["entry"] for e in f.get("left_out") or [])
    imported = (f"a template imported {f.get('preloaded')} modules of the list ({len(f.get('missing') or [])} "
                f"not in this stack{'; left out: ' + left_out if left_out else ''})")
    if not r.get("ok"):
        return probes.warn("faststart", f"could not try it: {probes.failure_text(r)}",
                           f"check that the stack's interpreter runs; {SETTING} = false turns the fast start off")
    if not f.get("ok"):
        fix = ("run SGLang on Linux with CPython 3.10 to 3.13, where prctl(PR_SET_CHILD_SUBREAPER) is allowed"
               if "preloaded" not in f else
               f"set {SETTING} = false here, or give the instance a preload list without the module named "
               f"(environment DFLASH_FASTSTART = a file like {PRELOAD.name})")
        return probes.warn("faststart", f"not usable here: {f.get('why')}; where the fast start is on, SGLang "
                           "spawns its children as before (each imports torch, transformers and SGLang "
                           "again: each start about 6 s slower on an H200)", f"nothing is needed for SGLang to work; {fix}")
    return probes.ok("faststart", f"available, on by default for instances of one GPU (tpSize 1; {SETTING} = "
                     f"false turns it off, true turns it on for tpSize > 1): {imported} and "
                     "a child forked from it came back as this process's own, in its process group (CUDA in "
                     f"a forked test child: {f.get('fork_probe')})")
