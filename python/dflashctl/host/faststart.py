"""The fast start: SGLang's children forked from a template that imported their libraries once.

The mechanism runs inside SGLang's processes (kernel_hook/dflash_faststart.py, standard library
only; docs/INTERNALS.md, "The fast start"). Here: `provide(env, on)` gives the SGLang child's
environment the start-up hook and $DFLASH_FASTSTART (the preload list shipped for SGLang 0.5.11,
data/sglang-0.5.11-preload.json, or a list the instance's `environment` names), or takes it away
when the instance's `fastStart` is false; `check` is doctor's `faststart` line from the stack's
interpreter trying it once (probe_child.probe_faststart).
"""

from pathlib import Path

from dflashctl.host import kernels, probes, sglang_0_5_11
from dflashctl.host.kernel_hook import dflash_faststart as hook

ENV = hook.ENV
PRELOAD = Path(__file__).resolve().parent / "data" / sglang_0_5_11.FASTSTART_PRELOAD
SETTING = "fastStart"


def provide(env: dict[str, str], on: bool) -> dict[str, str]:
    """`env` for SGLang with the fast start on (the hook on PYTHONPATH, $DFLASH_FASTSTART naming the
    preload list unless the instance's environment names its own or "0") or off (no variable)."""
    env = dict(env)
    if not on:
        env.pop(ENV, None)
        return env
    env.setdefault(ENV, str(PRELOAD))
    return kernels.hook_on_path(env) if env[ENV] != "0" else env


def check(r: dict) -> probes.Check:
    """ok: this interpreter started a child through a template, as the server's own child; warn
    with why not (SGLang then spawns its children as before: slower, nothing else changes)."""
    f = r.get("facts", {})
    if not r.get("ok"):
        why, fix = f"could not try it: {probes.failure_text(r)}", "check that the stack's interpreter runs"
    elif not f.get("ok"):
        why, fix = f"not available here: {f.get('why')}", ("run SGLang on Linux with CPython 3.10 to 3.13, "
                                                           "where prctl(PR_SET_CHILD_SUBREAPER) is allowed")
    else:
        return probes.ok("faststart", f"works here, on by default ({SETTING}): SGLang's scheduler and "
                         "detokenizer fork from a template that imported their libraries beside the server "
                         "(tried: a child forked as this process's own, in its process group)")
    return probes.warn("faststart", f"{why}; SGLang spawns its children as before (each imports torch, "
                       "transformers and SGLang again, about 12 s per start on an H200)",
                       f"nothing is needed for SGLang to work; for the faster start, {fix}; {SETTING} = false "
                       "turns the attempt off")
