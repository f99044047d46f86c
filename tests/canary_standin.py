"""Stand-in instances for the canary's tests and benchmark: builds of the smoke's model pairs.

A build is what an instance's definition hands the stand-in SGLang (tests/data/service/standin_server.py):
SGLang's flags and the environment. `builds(models)` writes the smoke's oracle pair and its broken
variant (smoke/oracle.py; smoke's `--pair broken`) once into `models` and names:
  oracle  DFLASH, the oracle drafter: every draft right, 16 tokens a verify step
  broken  the same target with the broken pair's drafter (it reads one position off): about one
          token a step, outputs identical (DFLASH is lossless), as on the H200
  plain   the oracle target without speculative decoding
  slower  oracle, every forward pass four times as long (slower kernels)
  refuses oracle whose context length is 8 tokens: SGLang's 400 to every canary prompt (16 tokens)
Every forward pass takes STEP_DELAY_S, about what one verify step of the oracle pair took on the
H200 (256 tokens in 16 steps, 0.0585 s: tests/data/smoke/h200-oracle). `Instance` runs one build on
one port and restarts it there with another, as a rollout does.
"""

import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from router_harness import ENV, STANDIN, free_port, request, stop_standin

from dflashctl.smoke import oracle

STEP_DELAY_S = 0.004


@dataclass(frozen=True)
class Build:
    name: str
    args: tuple[str, ...]
    env: dict = field(default_factory=dict)

    def with_env(self, name: str, **env: str) -> "Build":
        return replace(self, name=name, env={**self.env, **env})


def builds(models: Path, step_delay: float = STEP_DELAY_S) -> dict[str, Build]:
    good = oracle.write_pair(models)
    bad = oracle.write_pair(models, oracle.OracleShape(draft_offset_error=1))
    target = ("--model-path", str(good.target), "--skip-tokenizer-init")
    dflash = ("--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "16")
    env = {"STANDIN_STEP_DELAY": str(step_delay)}
    made = {"oracle": Build("oracle", target + dflash + ("--speculative-draft-model-path", str(good.draft)), env),
            "broken": Build("broken", target + dflash + ("--speculative-draft-model-path", str(bad.draft)), env),
            "plain": Build("plain", target, env)}
    made["slower"] = made["oracle"].with_env("slower", STANDIN_STEP_DELAY=str(4 * step_delay))
    made["refuses"] = made["oracle"].with_env("refuses", STANDIN_CONTEXT="8")
    return made


class Instance:
    """One stand-in process on 127.0.0.1:port, its log in `logs`."""

    def __init__(self, build: Build, logs: Path, port: int | None = None):
        self.build, self.logs, self.port = build, logs, port or free_port(55535)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> "Instance":
        self.starts += 1
        log = open(self.logs / f"standin-{self.port}-{self.starts}.log", "w")
        self.proc = subprocess.Popen([sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", str(self.port),
                                      *self.build.args], env=dict(ENV, STANDIN_READY_AFTER="0", **self.build.env),
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while request(self.url + "/health_generate", timeout=5)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stand-in {self.build.name} on {self.port} did not come up "
                                   f"(exit {self.proc.poll()}; {self.logs})")
            time.sleep(0.05)
        return self

    def restart(self, build: Build | None = None) -> "Instance":
        self.stop()
        self.build = build or self.build
        return self.start()

    def stop(self) -> None:
        stop_standin(self.proc)
