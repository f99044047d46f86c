"""serve's preflight: what a start needs, checked in child processes before any weights load.

Every check runs, whatever the others found, so one start names every problem; the first failure's
code is serve's exit status (a faulty GPU's first: it explains what fails after it).

The checks come in two parts, started together:
- what SGLang must not start without: the driver and the native libraries CUDA loads (NVML and
  dlopen, no CUDA; host/probes.BEFORE_START), the model pair's files and their weights against the
  GPUs' memory, the GPUs' health and the memory SGLang will claim. A failure here and SGLang is not
  started;
- the stack's imports (torch, sgl_kernel, the grammar backend, soundfile, sglang's parser): most of
  a preflight's time (about 2 s of an H200's 2.5, torch and sgl_kernel), and what SGLang's server
  process itself spends its first seconds on (the same imports; its children, which take the GPU,
  start 8 s or more later). So SGLang starts beside them. serve's READY=1 waits for them; a failure
  stops SGLang at once and is reported as the first part's would be, exit status included; SGLang
  dying meanwhile (an import that fails there fails here too) is reported as the check's failure.
"""

import os
import shutil
from pathlib import Path
from typing import Callable

from dflashctl.errors import PREFLIGHT_GPU_FAULT, PREFLIGHT_SGLANG, DflashError
from dflashctl.lock import locate
from dflashctl.service import config, gpu_claim, model_check, sdnotify
from dflashctl.service.server import _indent

STATUS_LIMIT = 3500  # the list of failures in STATUS=; sdnotify keeps it under systemd's datagram size


def lock_path() -> Path | None:
    """The lock whose versions the fixes name (None: the fixes say "the version the lock pins")."""
    return locate.find().path


def model_checks(cfg: config.InstanceConfig, python: str, child_env: dict[str, str],
                 config_path: str) -> list:
    """The target and its drafter, read where SGLang will load them (service/model_check.py), and
    their weights against the GPUs' memory."""
    found = model_check.check(cfg, child_env, config_path)
    return found.checks + model_check.memory_checks(cfg, found.weight_bytes, python, child_env)


class Preflight:
    """One start's preflight: started on construction, judged by before_start(), then by
    failed_beside() while SGLang starts and finish() before READY=1."""

    def __init__(self, cfg: config.InstanceConfig, python: str, child_env: dict[str, str],
                 config_path: str, say: Callable[[str], None]):
        try:
            from dflashctl.host import fingerprint, probes
        except ImportError as e:
            raise DflashError("dflashctl's preflight probes are missing", str(e),
                              "reinstall dflashctl; `--skip-preflight` starts without them", PREFLIGHT_SGLANG)
        self.cfg, self.python, self.env, self.config_path, self.say = cfg, python, child_env, config_path, say
        self._probes = probes
        for w in jit_toolchain_warnings(child_env):
            say(f"preflight warning: {w}")
        say("preflight: checking torch, sgl_kernel, grammar backend, soundfile, native libraries, driver, "
            "the model pair, GPU health and memory")
        self.stack = fingerprint.stack_of_lock(lock_path(), python)
        wanted = probes.preflight_wanted(cfg.grammar_backend, cfg.speculative.algorithm)
        self._first_keys = probes.probe_keys(wanted, probes.BEFORE_START)
        self._beside_keys = [k for k in wanted if k not in self._first_keys]
        self.run = probes.ProbeRun(python, wanted, probes.PREFLIGHT_TIMEOUT_S, child_env)
        self._first: list = []  # the first part's probe checks
        self._others: list = []  # the model pair and the GPUs
        self._judged, self._failed = False, None  # the stack's checks: read yet; every check if one failed

    def _probe_checks(self, results: dict, **which) -> list:
        return self._probes.preflight_checks(results, self.cfg.grammar_backend, self.cfg.speculative.algorithm,
                                             self.stack, **which)

    def _beside_checks(self) -> list:
        return self._probe_checks(self.run.results(self._beside_keys), leave_out=self._probes.BEFORE_START)

    def before_start(self) -> None:
        """Return once what SGLang must not start without has passed (the stack's checks go on);
        raise the whole list when anything failed, the stack's checks read too."""
        try:
            self._first = self._probe_checks(self.run.results(self._first_keys), only=self._probes.BEFORE_START)
            self._others = (model_checks(self.cfg, self.python, self.env, self.config_path)
                            # last: busy GPUs may free up
                            + gpu_claim.preflight_checks(self.cfg, self.python, self.env))
            if any(c.status == "fail" for c in self._first + self._others):
                checks = self._first + self._beside_checks() + self._others
                self._warn(checks)
                raise failure(checks, self.python, "SGLang was not started")
        except BaseException:
            self.stop()
            raise
        self._warn(self._first + self._others)

    def failed_beside(self) -> list | None:
        """Once the stack's checks have finished and one failed: every check (for failure());
        None while they run or when they passed."""
        if not self._judged and not self.run.done():
            return None
        return self.finish()

    def finish(self) -> list | None:
        """Wait for the stack's checks: every check when one failed (for failure()), else None, the
        preflight's passed line said."""
        if not self._judged:
            beside = self._beside_checks()
            self.run.close()
            self._warn(beside)
            checks = self._first + beside + self._others
            self._judged = True
            if any(c.status == "fail" for c in beside):
                self._failed = checks
            else:
                self.say(f"preflight: {len(checks)} checks passed")
        return self._failed

    def stop(self) -> None:
        """Kill the probes still running (serve is on its way out)."""
        self.run.stop()

    def _warn(self, checks: list) -> None:
        for c in checks:
            if c.status == "warn":
                self.say(f"preflight warning: {c.name}: {c.summary}")


def failure(checks: list, python: str, consequence: str) -> DflashError:
    """Every failure with its fix, in the unit's status and the log; the first one's exit code."""
    # A faulty GPU explains what fails after it (torch sees no GPU, sgl_kernel does not load): first.
    failed = sorted((c for c in checks if c.status == "fail"), key=lambda c: c.exit_code != PREFLIGHT_GPU_FAULT)
    doctor = f"dflashctl doctor --python {python}"
    head = f"preflight: {len(failed)} of {len(checks)} checks failed; {consequence}"
    items = [f"{i}. {c.name}: {c.summary}\n   fix: {c.fix}" for i, c in enumerate(failed, 1)]
    listed = f"{head} (evidence: {doctor}): " + " | ".join(items)
    sdnotify.status(listed, limit=STATUS_LIMIT)
    err = DflashError(head, "in root-cause order:\n" + _indent("\n".join(items)),
                      f"fix them in this order (the first is the likeliest root cause); `{doctor}` "
                      "shows every check with its evidence", failed[0].exit_code)
    err.status = listed  # what serve.run() leaves in StatusText: every failure with its fix
    return err


def jit_toolchain_warnings(env: dict[str, str]) -> list[str]:
    """What SGLang's first start compiles with, looked up as tvm-ffi and flashinfer do, in the child's env.

    Their JIT kernels are built with nvcc (CUDA_HOME/CUDA_PATH, else nvcc on PATH, else
    /usr/local/cuda; cuda_home.provide points CUDA_HOME at the stack's own nvcc wheels) and the host
    compiler `c++` (or CXX). SGLang 0.5.11 sets the GPU architecture itself (TVM_FFI_CUDA_ARCH_LIST
    from torch), so nvidia-smi is not needed. A missing tool only shows after the weights have
    loaded, so say it now. A warning, not a failure: a host may set these up in ways this cannot see.
    """
    path = env.get("PATH", os.defpath)
    missing = []
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if cuda_home:
        if not os.access(Path(cuda_home, "bin", "nvcc"), os.X_OK):
            missing.append(f"nvcc (CUDA_HOME={cuda_home} has no bin/nvcc)")
    elif not shutil.which("nvcc", path=path) and not os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        missing.append("nvcc (not on PATH, no CUDA_HOME, no /usr/local/cuda)")
    cxx = env.get("CXX", "c++")
    if not shutil.which(cxx, path=path):
        missing.append(f"the C++ compiler {cxx!r}")
    if not missing:
        return []
    return [f"SGLang compiles its JIT kernels at the first start (nvcc, c++; about a minute), but "
            f"{'; '.join(missing)} cannot be found with PATH={path}: the start will fail after the "
            "weights load. Install the locked stack (its nvidia-cuda-nvcc wheel provides nvcc) and "
            "gcc/g++ on the host, or set CUDA_HOME, CXX or PATH in the instance's environment"]
