"""What a rollout leaves for the next one: one rollout at a time, and what it left out of rotation.

`<state dir>/lock` is held (flock) for a rollout's whole run, so a second one is refused at once and
told which one runs. `<state dir>/state.json` (written atomically) says who holds the lock, its
status (running, then done, failed or interrupted: "running" after the process ended means it was
killed), which instances it is at (`current`), each instance's outcome and step (`instances`),
which instances it left out of the router (`left_out`: the reason, the step, and the canary's
reading taken before their restart: `--resume` starts from those and judges against it), and which
it restarted onto which settings (`done`, carried while a rollout has not finished, so that neither
`--resume` nor a re-run restarts them again).
"""

import errno
import fcntl
import json
import os
import time
from pathlib import Path

from dflashctl import output
from dflashctl.errors import CONFIG, ROLLOUT_BUSY, DflashError

STATE_VERSION = 1


def default_dir() -> Path:
    """systemd's StateDirectory (the NixOS unit), else /var/lib for root, else the user's state."""
    given = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if given:
        return Path(given)
    if os.geteuid() == 0:
        return Path("/var/lib/dflash-rollout")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base, "dflash-rollout")


class RolloutLock:
    """`with RolloutLock(dir) as lock:` — the lock for this rollout, and the state it reads and writes."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.state_path = self.dir / "state.json"
        self._fd: int | None = None

    def __enter__(self) -> "RolloutLock":
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise DflashError(f"cannot use the rollout state directory {self.dir}", e.strerror or str(e),
                              "run as root, or pass --state-dir a directory you can write", CONFIG) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._fd)
            self._fd = None
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise self._busy() from None
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None

    def _busy(self) -> DflashError:
        held = self.read()
        since = held.get("started")
        at = ", ".join(held.get("current") or []) or "between instances"
        who = (f"pid {held.get('pid')}, started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
               if since else "pid unknown")
        return DflashError("another rollout is running on this host", f"{who}, at: {at} "
                           f"(it holds {self.dir / 'lock'})",
                           "wait for it to finish (`journalctl -u dflash-rollout -f` under the NixOS "
                           "unit), or stop it: it puts back what it took out", ROLLOUT_BUSY)

    def read(self) -> dict:
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) and data.get("version") == STATE_VERSION else {}

    def write(self, state: dict) -> None:
        # whole or not at all; a full disk is one error naming the file (output.write)
        output.write(self.state_path, json.dumps({**state, "version": STATE_VERSION, "updated": time.time()},
                                                 indent=2) + "\n", "the rollout state")
