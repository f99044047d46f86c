"""Errors a user can act on, and the exit codes the service's restart policy relies on.

Every failure a user can meet is raised as `DflashError(what, why, fix)`; the CLI prints it as one
paragraph and exits with its code, never with a traceback.
"""

# Generic outcomes.
OK = 0
FAILED = 1  # a check found a problem (lock --check, doctor, diff, smoke)
USAGE = 2  # argparse's own code for bad arguments
NOT_LOSSLESS = 4  # smoke: a speculative run's greedy outputs differ from the baseline's
GRAMMAR_VIOLATION = 5  # smoke: a constrained output broke its grammar, or a constrained request failed
DRAFTS_REJECTED = 6  # smoke: the oracle pair's acceptance left its band: the draft path is broken
ROLLOUT_STOPPED = 7  # rollout: a step failed or was interrupted; the instances not reached still serve
INPUT = 66  # EX_NOINPUT: an input file (lock, spec, fingerprint) cannot be read or is not one
OUTPUT = 73  # EX_CANTCREAT: an output file cannot be written (nothing was written: output.py)
ROLLOUT_BUSY = 75  # EX_TEMPFAIL: another rollout holds this host's rollout lock
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), or SIGTERM where the command has no handler of its own (cli.py)

# Failures that repeat identically on every start: systemd must not restart them
# (listed in RestartPreventExitStatus in python/dflashctl/service/data/service-unit.json; a test keeps both in step).
CONFIG = 78  # EX_CONFIG: the instance settings are invalid
PREFLIGHT_MODEL_PAIR = 79  # the model's or the drafter's files do not fit SGLang or each other
PREFLIGHT_TORCH = 80  # torch missing, not the CUDA 13 build, or no GPU visible
PREFLIGHT_KERNEL = 81  # sgl_kernel's common_ops does not load on this GPU
PREFLIGHT_GRAMMAR = 82  # the selected grammar backend lacks what SGLang imports
PREFLIGHT_SOUNDFILE = 83  # soundfile / libsndfile missing (SGLang imports it at start)
PREFLIGHT_NATIVE = 84  # libnuma or libcuda does not resolve
PREFLIGHT_DRIVER = 85  # the NVIDIA driver is too old for CUDA 13
PREFLIGHT_SGLANG = 86  # sglang itself does not import, or lacks the requested algorithm
PREFLIGHT_MODEL_MISSING = 88  # offline and not fully in the cache, or a local model's files missing
# An instance's GPU is lost, has a row remap pending or failed, or uncorrected ECC errors since its last
# reset: it stays so until an operator resets or replaces it (docs/service.md, "When a GPU fails").
PREFLIGHT_GPU_FAULT = 89
NO_RESTART = (CONFIG, PREFLIGHT_MODEL_PAIR, PREFLIGHT_TORCH, PREFLIGHT_KERNEL, PREFLIGHT_GRAMMAR,
              PREFLIGHT_SOUNDFILE, PREFLIGHT_NATIVE, PREFLIGHT_DRIVER, PREFLIGHT_SGLANG, PREFLIGHT_MODEL_MISSING,
              PREFLIGHT_GPU_FAULT)

# Failures worth a restart with backoff (a crash can be transient: OOM, a GPU reset).
PREFLIGHT_GPU_BUSY = 87  # another process holds the GPU memory SGLang would claim (it may finish)
SERVER_DIED_BEFORE_READY = 90
SERVER_DIED_AFTER_READY = 91
SERVER_START_TIMEOUT = 92
SERVER_STALLED = 93  # no start-up progress (log, GPU memory) for stallTimeoutSec
# The GPU watch saw the instance's GPU fail (a critical XID, lost, new uncorrected ECC errors): SGLang
# was stopped. Restarted: the next start's preflight refuses a GPU that is still faulty (exit 89).
SERVER_GPU_FAILED = 94
# SGLang cannot listen on the instance's host:port: another program holds the port (it may be the last
# start's SGLang, still stopping), or the address is not this machine's (yet, at boot).
PORT_TAKEN = 95


class DflashError(Exception):
    """A failure explained in one paragraph: what failed, why, and the one thing that fixes it."""

    def __init__(self, what: str, why: str = "", fix: str = "", exit_code: int = FAILED):
        super().__init__(what)
        self.what, self.why, self.fix, self.exit_code = what, why, fix, exit_code

    def __str__(self) -> str:
        text = self.what
        if self.why:
            text += f": {self.why}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class Terminated(BaseException):
    """SIGTERM, raised where the command is (cli.main's handler; Ctrl-C raises KeyboardInterrupt the
    same way), so that it ends as an interruption: `finally` blocks run (children stopped, temporary
    files removed) and `--json` still prints its one object. A BaseException, as KeyboardInterrupt
    is, so that no `except Exception` swallows it."""
