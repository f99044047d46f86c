"""A host for `dflashctl rollout` on loopback: N instances (`dflashctl serve` with the stand-in SGLang)
under tests/rollout_harness.py's supervisor, the real router in front, the rollout's command line.
Used by tests/operations/test_rollout.py and test_rollout_faults.py.
"""

import json
import subprocess
import sys
from pathlib import Path

from rollout_harness import QUICK_CANARY, Supervisor, serve_argv
from router_harness import ENV, STANDIN, Load, Router, free_port, generate_body

from dflashctl.service import config



class Host:
    """N instances under the supervisor, the router in front, the rollout's command line."""

    def __init__(self, tmp: Path, n: int, settings: dict | None = None, **env: str):
        self.tmp = tmp
        self.sup = Supervisor(tmp)
        self.files = []
        for i in range(n):
            path = tmp / f"gpu{i}.json"
            path.write_text(json.dumps({
                "name": f"gpu{i}", "model": "standin-model", "port": free_port(config.MAX_PORT), **(settings or {}),
                "environment": {"STANDIN_READY_AFTER": "1.0", "STANDIN_TOKEN_DELAY": "0.002", **env}}))
            self.files.append(path)
            self.sup.add(f"gpu{i}", serve_argv(path, STANDIN), dict(ENV, LOGS_DIRECTORY=str(tmp)))
        self.urls = [config.load(f).base_url for f in self.files]
        self.router: Router | None = None
        self.canary = QUICK_CANARY
        self.restart_command: str | None = None  # None: the supervisor's own

    def edit(self, i: int, **changes) -> None:
        """A new definition of instance i (its settings file: what a restart starts)."""
        s = json.loads(self.files[i].read_text())
        env = {**s["environment"], **changes.pop("environment", {})}
        self.files[i].write_text(json.dumps({**s, **changes, "environment": env}))

    def state(self) -> dict:
        return json.loads((self.tmp / "state" / "state.json").read_text())

    def start(self, router: bool = True) -> "Host":
        self.sup.serve_control().start_all()
        if router:
            self.router = Router({"workers": self.urls}, self.tmp).start()
            self.router.wait_healthy(self.urls)
            (self.tmp / "router-settings.json").write_text(json.dumps(self.router.settings))
        return self

    def argv(self, *extra: str, router: bool = True) -> list[str]:
        argv = [sys.executable, "-m", "dflashctl", "rollout", "--restart-command",
                self.restart_command or self.sup.restart_command,
                "--state-dir", str(self.tmp / "state"), "--healthy-for", "1", "--json", *self.canary]
        argv += ["--router", str(self.tmp / "router-settings.json")] if router else ["--no-router"]
        for f in self.files:
            argv += ["--instance", str(f)]
        return argv + list(extra)

    def rollout(self, *extra: str, router: bool = True, timeout: float = 300) -> tuple[int, dict, str]:
        r = subprocess.run(self.argv(*extra, router=router), env=ENV, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}, r.stderr

    def load(self, body: dict | None = None, clients: int = 8) -> Load:
        return Load(self.router.url + "/generate", body or generate_body(16), clients=clients, max_requests=10**7,
                    seconds=600).start()

    def popen(self, *extra: str) -> subprocess.Popen:
        """The rollout as a process of its own, its stderr read line by line (signals, faults)."""
        return subprocess.Popen(self.argv(*extra), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def starts(self) -> dict[str, int]:
        return {n: i.starts for n, i in self.sup.instances.items()}

    def stop(self):
        if self.router:
            self.router.stop()
        self.sup.shutdown()
