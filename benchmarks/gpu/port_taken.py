"""A real SGLang 0.5.11 instance whose port another program holds (docs/service.md, exit 95).

    python3 benchmarks/gpu/port_taken.py SETTINGS.json LOG_DIR

Two starts of `dflashctl serve` on the settings (an instance of two_instances.py, not running):
1. the port held before serve starts: serve refuses it at once, naming this script's pid;
2. the port taken after serve's own check, while SGLang loads (it binds only after the weights,
   KV cache and CUDA graphs): SGLang fails to listen and ends its children (launch_server's
   `finally`); serve reads that from its log and names the holder, exit 95, not a bare crash (90).
After each: how long it took, serve's last lines, and the sglang processes left on the host.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

settings, logs = Path(sys.argv[1]), Path(sys.argv[2])
port = json.loads(settings.read_text())["port"]
argv = [sys.executable, "-m", "dflashctl", "serve", "--config", str(settings), "--python", sys.executable]
env = dict(os.environ, LOGS_DIRECTORY=str(logs))


def holder() -> socket.socket:
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


print(f"port {port}; sglang processes before: {sglang_left() or 'none'}")
held = holder()
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
held = holder()
took_at = time.monotonic()
print(f"== 2. port taken {took_at - t0:.1f} s after serve started, as SGLang began to load")
try:
    rest = proc.communicate(timeout=300)[1]
except subprocess.TimeoutExpired:
    proc.kill()
    rest = proc.communicate()[1] + "\n(port_taken.py: serve did not end within 300 s; killed)"
report("2. port taken while SGLang loads", proc.returncode, time.monotonic() - took_at, "".join(lines) + rest)
held.close()
