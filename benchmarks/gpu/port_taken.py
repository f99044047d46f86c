"""A real SGLang 0.5.11 instance whose port another program holds (docs/service.md, exit 95).

    python3 benchmarks/gpu/port_taken.py SETTINGS.json LOG_DIR

Two starts of `dflashctl serve` on the settings (an instance of two_instances.py, not running):
1. the port held before serve starts: serve refuses it at once, naming this script's pid;
2. the port taken after serve's own check, while SGLang loads (it binds only after the weights,
   KV cache and CUDA graphs): SGLang fails to listen and does not exit (its warm-up asks the port's
   holder, which answers nothing, for minutes); serve reads the failed bind from its log, stops
   SGLang and names the holder, exit 95.
After each: how long it took, serve's last lines, and the sglang processes left on the host.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def holder(port: int) -> socket.socket:
    """A socket of this script listening on the port and answering nothing (its backlog takes the
    connections), as a program that holds it would."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def sglang_left() -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if d.name.isdigit() and int(d.name) != os.getpid() and ("sglang" in cmd and "port_taken" not in cmd):
            found.append(f"{d.name} {cmd[:120]}")
    return found


def report(case: str, rc: int, took: float, err: str) -> None:
    print(f"== {case}: serve exit {rc} after {took:.1f} s (this script is pid {os.getpid()})")
    for line in err.splitlines()[-14:]:
        print("   " + line[:400])
    print(f"   sglang processes left: {sglang_left() or 'none'}", flush=True)


def main() -> None:
    settings, logs = Path(sys.argv[1]), Path(sys.argv[2])
    port = json.loads(settings.read_text())["port"]
    argv = [sys.executable, "-m", "dflashctl", "serve", "--config", str(settings), "--python", sys.executable]
    env = dict(os.environ, LOGS_DIRECTORY=str(logs))
    print(f"port {port}; sglang processes before: {sglang_left() or 'none'}")
    held = holder(port)
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    report("1. port held before serve starts", done.returncode, time.monotonic() - t0, done.stderr)
    held.close()

    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    t0, lines = time.monotonic(), []
    for line in proc.stderr:
        lines.append(line)
        if "starting SGLang" in line:
            break
    held = holder(port)
    took_at = time.monotonic()
    print(f"== 2. port taken {took_at - t0:.1f} s after serve started, as SGLang began to load", flush=True)
    try:
        rest = proc.communicate(timeout=240)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        rest = proc.communicate()[1] + "\n(port_taken.py: serve did not end within 240 s; killed)"
    report("2. port taken while SGLang loads", proc.returncode, time.monotonic() - took_at, "".join(lines) + rest)
    held.close()
    log = logs / f"dflash-{json.loads(settings.read_text())['name']}-sglang.log"
    if log.exists():  # SGLang's own lines about the bind and what followed
        print("== SGLang's log, its last 25 lines")
        for line in log.read_text(errors="replace").splitlines()[-25:]:
            print("   " + line[:300])


if __name__ == "__main__":
    main()
