"""Does `dflashctl serve` see a child's death with the fast start on, and leave nothing behind?

    python3 benchmarks/gpu/faststart_death.py --out DIR [--fast-start | --no-fast-start] [--launcher CMD]

One DFLASH instance of the smoke's oracle pair (the settings of benchmarks/gpu/watch_cost.py) under
the real `dflashctl serve`; once it is ready (READY=1 on a notify socket this script plays), the
scheduler is killed with SIGKILL (as the OOM killer would), and the script measures how long serve
takes to exit, with which code, and which processes of the instance are left (its process group,
and a fast start template started for its server, found by the server's pid on its command line). The scheduler is found by its
process title (SGLang names it `sglang::scheduler...`), else from $STANDIN_CHILD_PIDFILE (the
stand-in SGLang, for checking this script without a GPU: --launcher "python3
tests/data/service/standin_server.py"). Writes DIR/faststart-death.json and prints one line.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "python"))
from dflashctl.smoke import oracle  # noqa: E402
from dflashctl.smoke.settings import DEFAULT_SYNTHETIC_KV_TOKENS  # noqa: E402

PORT = 31150


def settings(work: Path, fast: bool, standin: bool) -> Path:
    s = {"name": "death", "port": PORT, "gpus": [0], "startTimeoutSec": 600, "fastStart": fast,
         "cacheDir": str(work / "cache")}
    if standin:
        s.update(model="stand-in", environment={"STANDIN_MODE": "healthy",
                                                "STANDIN_CHILD_PIDFILE": str(work / "pids.json")})
    else:
        pair = oracle.write_pair(work / "models")
        s.update(model=str(pair.target), draftModel=str(pair.draft),
                 speculative={"algorithm": "DFLASH", "numDraftTokens": 16, "draftAttentionBackend": "triton"},
                 attentionBackend="triton", samplingBackend="pytorch", skipTokenizerInit=True,
                 grammarBackend="none", memFractionStatic=0.5, cudaGraphMaxBs=8,
                 extraArgs=["--disable-piecewise-cuda-graph", "--max-total-tokens", str(DEFAULT_SYNTHETIC_KV_TOKENS)])
    path = work / "death.json"
    path.write_text(json.dumps(s, indent=2))
    return path


def stat(pid: int) -> tuple[int, int] | None:
    """(parent, process group) from /proc, None when gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[1]), int(fields[2])) if fields[0] != "Z" else None


def cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(root: int) -> set[int]:
    """Every process below root (by parent pid): SGLang's children need not share its process group."""
    parent = {p: (stat(p) or (0, 0))[0] for p in pids()}
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def server_pid(serve: int) -> int | None:
    """SGLang's server: the child of serve that leads its own process group, other than serve's GPU
    watch (also such a child, a `python -c` running the probes' gpu_watch)."""
    leaders = [p for p in pids() if (stat(p) or (0, 0))[0] == serve and (stat(p) or (0, 0))[1] == p]
    return next((p for p in leaders if " gpu_watch " not in cmdline(p)), None)


def scheduler_pid(server: int, work: Path) -> int | None:
    for pid in descendants(server):
        if "sglang::scheduler" in cmdline(pid):
            return pid
    pidfile = work / "pids.json"
    return json.loads(pidfile.read_text())["scheduler"] if pidfile.exists() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fast-start", dest="fast", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--launcher", help="the SGLang launcher serve starts (default: the stack's python -m sglang...)")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="faststart-death-"))
    cfg = settings(work, a.fast, a.launcher is not None)
    notify_path = work / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    argv = [a.python, "-m", "dflashctl", "serve", "--config", str(cfg), "--log-file", str(a.out / "faststart-death-sglang.log")]
    if a.launcher:
        argv += ["--launcher", a.launcher, "--skip-preflight"]
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_path), PYTHONPATH=os.pathsep.join(
        [str(REPO / "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    t0 = time.monotonic()
    serve = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    result: dict = {"fast_start": a.fast}
    notify.settimeout(1.0)
    while "ready_s" not in result and serve.poll() is None and time.monotonic() - t0 < 600:
        try:
            if "READY=1" in notify.recv(4096).decode():
                result["ready_s"] = round(time.monotonic() - t0, 1)
        except socket.timeout:
            pass
    if "ready_s" not in result:
        serve.kill()
        result["error"] = f"serve not ready (exit {serve.poll()})"
    else:
        server = server_pid(serve.pid)
        before = {p: cmdline(p) for p in {server} | descendants(server)}
        victim = scheduler_pid(server, work)
        result.update(server=server, processes_before=len(before), scheduler=victim,
                      titles={p: c[:160] for p, c in sorted(before.items())})
        if victim is None:
            serve.send_signal(signal.SIGTERM)
            result["error"] = "no scheduler (process title sglang::scheduler) below the instance's server"
        else:
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            serve.wait(120)
            result["serve_exit_s"] = round(time.monotonic() - killed, 2)
            result["serve_exit_code"] = serve.returncode
    out, _ = serve.communicate(timeout=120)
    time.sleep(0.5)
    server = result.get("server")
    left = {p: cmdline(p) for p in pids() if server and ((stat(p) or (0, 0))[1] == server  # its group, or a
            or ("f.template_main()" in cmdline(p) and f" {server} " in cmdline(p)))}  # template it started
    result["left_behind"] = {str(p): c[:200] for p, c in left.items()}
    result["serve_tail"] = out.splitlines()[-8:]
    (a.out / "faststart-death.json").write_text(json.dumps(result, indent=2))
    print(f"fast start {'on' if a.fast else 'off'}: ready {result.get('ready_s')} s; scheduler {result.get('scheduler')} "
          f"killed: serve exited {result.get('serve_exit_code')} after {result.get('serve_exit_s')} s; "
          f"{len(left)} process(es) left{': ' + str(result['left_behind']) if left else ''}"
          f"{'; error: ' + result['error'] if result.get('error') else ''}")
    return 0 if not left and result.get("serve_exit_s") is not None else 1


if __name__ == "__main__":
    sys.exit(main())
