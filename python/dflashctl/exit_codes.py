"""Which exit codes each command can end with: the one table that each command's `--help` prints
and docs/cli.md shows (tests/cli/test_cli_contract.py holds the three and errors.py equal, and runs
every command on bad input to see it end with a code of its row).

A new command adds its row to BY_COMMAND: the codes beyond COMMON it can end with, each with the
meaning it has there (None: the general meaning in MEANING). A new code in errors.py adds its
general meaning to MEANING.
"""

from dflashctl import errors as e

MEANING = {
    e.OK: "success",
    e.FAILED: "a check found a problem",
    e.USAGE: "bad arguments (argparse, or options that do not go together)",
    e.NOT_LOSSLESS: "a speculative run's greedy outputs differ from plain decoding's",
    e.GRAMMAR_VIOLATION: "a constrained output broke its grammar, or a constrained request failed",
    e.DRAFTS_REJECTED: "the oracle pair's acceptance left its band: the draft path is broken",
    e.ROLLOUT_STOPPED: "a rollout step failed or was interrupted; the instances not reached still serve",
    e.ROLLOUT_BUSY: "another rollout holds this host's rollout lock",
    e.INPUT: "an input file (lock, spec, fingerprint) is unreadable or not one",
    e.OUTPUT: "an output file cannot be written; nothing was written",
    e.CONFIG: "the settings are invalid or unreadable (not restarted by systemd)",
    e.PREFLIGHT_TORCH: "torch missing, not the CUDA 13 build, or no GPU visible",
    e.PREFLIGHT_KERNEL: "sgl_kernel's common_ops does not load on this GPU",
    e.PREFLIGHT_GRAMMAR: "the grammar backend lacks what SGLang imports",
    e.PREFLIGHT_SOUNDFILE: "soundfile / libsndfile missing",
    e.PREFLIGHT_NATIVE: "libnuma or libcuda does not resolve",
    e.PREFLIGHT_DRIVER: "the NVIDIA driver is missing, too old for CUDA 13, or not the loaded module's version",
    e.PREFLIGHT_SGLANG: "SGLang does not import, or lacks the requested algorithm",
    e.PREFLIGHT_GPU_BUSY: "other processes hold the GPU memory SGLang would claim (restarted)",
    e.PREFLIGHT_MODEL_MISSING: "offline, and the pinned revision is not whole in the cache",
    e.PREFLIGHT_MODEL_PAIR: "the model and its drafter do not fit together, or a model's files are unusable",
    e.PREFLIGHT_GPU_FAULT: "the instance's GPU is lost or has an uncorrected memory fault (not restarted)",
    e.SERVER_DIED_BEFORE_READY: "SGLang died before it was ready (restarted)",
    e.SERVER_DIED_AFTER_READY: "SGLang died while serving (restarted)",
    e.SERVER_START_TIMEOUT: "SGLang was not ready within startTimeoutSec (restarted)",
    e.SERVER_STALLED: "SGLang's start made no progress for stallTimeoutSec (restarted)",
    e.SERVER_GPU_FAILED: "the GPU watch saw the instance's GPU fail while serving; SGLang was stopped "
                         "(restarted)",
    e.PORT_TAKEN: "SGLang cannot listen on the instance's host:port: another program holds it, or the "
                  "address is not this machine's (restarted)",
    e.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM)",
}

COMMON = (e.OK, e.USAGE, e.INTERRUPTED)  # every command
PREFLIGHT = (e.PREFLIGHT_TORCH, e.PREFLIGHT_KERNEL, e.PREFLIGHT_GRAMMAR, e.PREFLIGHT_SOUNDFILE,
             e.PREFLIGHT_NATIVE, e.PREFLIGHT_DRIVER, e.PREFLIGHT_SGLANG, e.PREFLIGHT_GPU_BUSY,
             e.PREFLIGHT_MODEL_MISSING, e.PREFLIGHT_MODEL_PAIR, e.PREFLIGHT_GPU_FAULT)

BY_COMMAND: dict[str, dict[int, str | None]] = {
    "lock": {e.FAILED: "the lock is stale or was edited, the resolution failed, or the resolved stack "
                       "breaks the ABI contract",
             e.INPUT: None, e.OUTPUT: None},
    "export": {e.INPUT: "the lock is unreadable, not a lock, or misses a package another one needs",
               e.OUTPUT: None},
    "audit": {e.FAILED: "the Nix build of the lock would fail (each problem listed), or a wheel could "
                        "not be fetched",
              e.INPUT: "the lock or the spec is unreadable, or --repo is not the flake's checkout",
              e.OUTPUT: "the wheel cache (--cache) cannot be written"},
    "doctor": {e.FAILED: "a check failed (each with its fix)", e.INPUT: "--lock names an unreadable lock",
               e.CONFIG: "a --model-config is unreadable", e.OUTPUT: None},
    "diff": {e.FAILED: "the hosts differ in a failing check, an ABI-breaking item or the weights they serve",
             e.INPUT: "a file is unreadable or not a fingerprint (nor a smoke result with one)"},
    "kernels": {e.FAILED: "a kernel did not build, or status: the directory does not cover the arch "
                          "and shapes",
                e.CONFIG: "an argument (arch, model config, recording, environment) is refused",
                e.INPUT: "status: the directory holds no index of `kernels build`",
                e.OUTPUT: None},
    "validate": {e.CONFIG: None, e.PREFLIGHT_MODEL_PAIR: "--models: the model pair does not fit",
                 e.PREFLIGHT_MODEL_MISSING: "--models: a hub model is not in the cache, so it was not checked "
                                            "(--skip-unfetched accepts that)"},
    "serve": {e.CONFIG: None, **{c: None for c in PREFLIGHT}, e.SERVER_DIED_BEFORE_READY: None,
              e.SERVER_DIED_AFTER_READY: None, e.SERVER_START_TIMEOUT: None, e.SERVER_STALLED: None,
              e.SERVER_GPU_FAILED: None, e.PORT_TAKEN: None, e.OUTPUT: "--log-file cannot be written"},
    "unit": {e.CONFIG: "the settings are invalid, or a path the unit needs is one its sandbox hides",
             e.OUTPUT: None},
    "router": {e.CONFIG: None, e.FAILED: "--sync: the running router refused a change"},
    "router-unit": {e.CONFIG: "the settings are invalid, or a path the unit needs is one its sandbox hides",
                    e.OUTPUT: None},
    "rollout": {e.CONFIG: "the settings, the router's or an option are refused, or the state directory "
                          "cannot be used",
                e.ROLLOUT_STOPPED: None, e.ROLLOUT_BUSY: None},
    "upgrade": {e.FAILED: "the new build did not install (nothing was restarted), or after the rollout an "
                          "instance does not run it",
                e.INPUT: "--requirements or --glue is unreadable",
                e.CONFIG: "the settings, an option or a tool the step needs (systemctl, nix) are refused or missing",
                e.OUTPUT: "--root, --units-dir or the state directory cannot be written",
                e.ROLLOUT_STOPPED: "the rollout stopped: the instances it did not reach still serve the old build",
                e.ROLLOUT_BUSY: None},
    "models": {e.FAILED: "a download or its verification failed, or status: a model is not whole in "
                         "the cache",
               e.CONFIG: None, e.OUTPUT: "the cache directory cannot be written"},
    "status": {e.FAILED: "something is unhealthy (each problem listed)",
               e.INPUT: "--host: a file is unreadable or not a `status --json` report",
               e.CONFIG: "the instances' or the router's settings are invalid or unreadable, or an option "
                         "names no instance"},
    "monitoring": {e.CONFIG: "the instances' or the router's settings are invalid or unreadable, or an "
                             "option names no instance or alert, or the fleet's hosts' files disagree",
                   e.INPUT: "--host/--from: a host's scrape.json or rules.json is unreadable or not one",
                   e.OUTPUT: None},
    "smoke": {e.FAILED: "a run failed: a server died, a response was empty, or speculative decoding "
                        "was not active",
              e.NOT_LOSSLESS: None, e.GRAMMAR_VIOLATION: None, e.DRAFTS_REJECTED: None,
              e.PREFLIGHT_DRIVER: None, e.PREFLIGHT_SGLANG: None,
              e.PREFLIGHT_MODEL_PAIR: "--model and --draft-model do not fit together",
              e.SERVER_DIED_BEFORE_READY: "a server died before it was ready",
              e.SERVER_DIED_AFTER_READY: "a server died while measured",
              e.SERVER_START_TIMEOUT: "a server was not ready within --start-timeout",
              e.SERVER_STALLED: "a server's start made no progress", e.OUTPUT: None},
}


def codes(command: str) -> tuple[int, ...]:
    """The codes `command` can end with (a command without its row yet: COMMON only, and
    tests/cli/test_cli_contract.py fails until the row is there)."""
    return tuple(sorted(set(COMMON) | set(BY_COMMAND.get(command, {}))))


def meaning(command: str, code: int) -> str:
    return BY_COMMAND.get(command, {}).get(code) or MEANING.get(code, "(see errors.py)")


def epilog(command: str) -> str:
    rows = [f"  {code:>3}  {meaning(command, code)}" for code in codes(command)]
    return "exit codes (docs/cli.md):\n" + "\n".join(rows)
