"""A stand-in for `python -m sglang.launch_server`: a real HTTP server process for supervisor tests.

Takes SGLang's flags (uses --port and --host, ignores the rest) and behaves as STANDIN_MODE says:
  healthy          /health_generate answers 503 for STANDIN_READY_AFTER seconds, then 200
  crash            logs a few lines, then exits 3 after STANDIN_READY_AFTER seconds (never ready)
  hang             listens, but /health_generate never answers 200
  die-after-ready  like healthy, then exits 4 STANDIN_DIE_AFTER seconds after the first 200
  silent           never listens at all
  stall            listens (503 to every health poll, logged as SGLang's access log would), logs a
                   loading line every STANDIN_PROGRESS_EVERY seconds for STANDIN_STALL_AFTER seconds,
                   then "Capturing CUDA graphs", then nothing more
It writes its argv as JSON to STANDIN_ARGV_FILE, appends a line to STANDIN_OK_FILE before each 200,
and exits 0 on SIGTERM. For the systemd tier (tests/test_systemd.py), also:
  STANDIN_CHILDREN=N  start N helper processes in its process group that ignore SIGTERM (SGLang's
                      scheduler and detokenizer stay in the group; a stuck one must still go)
  STANDIN_MARK=1      append "pid uid" to standin-starts in $HOME and in $HF_HOME, and in each
                      JIT cache directory dflashctl names (TVM_FFI_CACHE_DIR, CUTE_DSL_CACHE_DIR, ...)
  STANDIN_JIT=1       first compile and run, with `c++` from PATH in $HOME/jit, a program that
                      dlopens a shared library, as SGLang's first start does (exit 5 if that fails)
"""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

mode = os.environ.get("STANDIN_MODE", "healthy")
ready_after = float(os.environ.get("STANDIN_READY_AFTER", "0.5"))
die_after = float(os.environ.get("STANDIN_DIE_AFTER", "0.3"))
args = sys.argv[1:]
port = int(args[args.index("--port") + 1]) if "--port" in args else 30000
host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
started = time.monotonic()
served_ok = threading.Event()

JIT_CACHES = ("TVM_FFI_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUTE_DSL_CACHE_DIR", "TRITON_CACHE_DIR",
              "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR")  # what dflashctl names (host/jit_caches.py)
if os.environ.get("STANDIN_ARGV_FILE"):
    with open(os.environ["STANDIN_ARGV_FILE"], "w") as f:
        json.dump({"argv": sys.argv, "env": {k: v for k, v in os.environ.items()
                                             if k in ("CUDA_VISIBLE_DEVICES", "HF_HOME", "FOO", "HF_TOKEN",
                                                      "HF_HUB_OFFLINE", *JIT_CACHES)}}, f)


def on_term(signum, frame):
    print(f"standin: got signal {signum}, shutting down", flush=True)
    os._exit(0)


signal.signal(signal.SIGTERM, on_term)
print(f"standin: mode={mode} port={port}", flush=True)
print("standin: Loading safetensors checkpoint shards", flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = time.monotonic() - started >= ready_after
        if self.path == "/health_generate" and ready and mode in ("healthy", "die-after-ready"):
            if os.environ.get("STANDIN_OK_FILE"):  # written before the 200 leaves: tests order on it
                with open(os.environ["STANDIN_OK_FILE"], "a") as f:
                    f.write(f"200 auth={self.headers.get('Authorization')}\n")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"")
            served_ok.set()
        else:
            self.send_response(503)
            self.end_headers()

    def log_message(self, fmt, *a):
        print("standin: " + fmt % a, flush=True)


def exit_now(code: int) -> None:
    if os.environ.get("STANDIN_DEATH_FILE"):  # the benchmark times supervisor exit from here
        with open(os.environ["STANDIN_DEATH_FILE"], "w") as f:
            f.write(repr(time.time()))
    os._exit(code)


def crash_later():
    time.sleep(ready_after)
    print("standin: ImportError: cannot import name 'StructuralTag' from 'xgrammar'", flush=True)
    exit_now(3)


def die_after_ready():
    served_ok.wait()
    time.sleep(die_after)
    print("standin: CUDA error: an illegal memory access was encountered", flush=True)
    exit_now(4)


JIT_LIB = 'extern "C" int answer() { return 42; }\n'
JIT_MAIN = r"""#include <dlfcn.h>
#include <cstdio>
int main(int argc, char **argv) {
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { std::printf("dlopen failed: %s\n", dlerror()); return 1; }
  auto answer = reinterpret_cast<int (*)()>(dlsym(lib, "answer"));
  std::printf("answer=%d\n", answer ? answer() : -1);
  return 0;
}
"""


def jit_build() -> None:
    """Compile a shared library and a program that dlopens it, under $HOME, and run the program."""
    work = os.path.join(os.environ["HOME"], "jit")
    os.makedirs(work, exist_ok=True)
    for name, text in (("answer.cpp", JIT_LIB), ("main.cpp", JIT_MAIN)):
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    cxx = os.environ.get("CXX", "c++")
    steps = [[cxx, "-shared", "-fPIC", "-O1", "-o", "libanswer.so", "answer.cpp"],
             [cxx, "-O1", "-o", "main", "main.cpp", "-ldl"], ["./main", os.path.join(work, "libanswer.so")]]
    for argv in steps:
        r = subprocess.run(argv, cwd=work, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"standin: jit step {argv} failed ({r.returncode}): {r.stdout}{r.stderr}", flush=True)
            exit_now(5)
    print(f"standin: jit ok: {r.stdout.strip()} (built in {work})", flush=True)


def helper_child() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)


for _ in range(int(os.environ.get("STANDIN_CHILDREN", "0"))):
    if os.fork() == 0:
        helper_child()
if os.environ.get("STANDIN_MARK") == "1":
    jit = [os.environ[v] for v in JIT_CACHES if v in os.environ]
    for directory in {os.environ["HOME"], os.environ["HF_HOME"], *jit}:  # HOME and HF_HOME: often one
        os.makedirs(directory, exist_ok=True)  # the JIT caches' directories are made by their tools
        with open(os.path.join(directory, "standin-starts"), "a") as f:
            f.write(f"{os.getpid()} {os.getuid()}\n")
if os.environ.get("STANDIN_JIT") == "1":
    jit_build()
if mode == "crash":
    threading.Thread(target=crash_later, daemon=True).start()
if mode == "die-after-ready":
    threading.Thread(target=die_after_ready, daemon=True).start()
def progress_then_stall():
    every = float(os.environ.get("STANDIN_PROGRESS_EVERY", "0.2"))
    end = started + float(os.environ.get("STANDIN_STALL_AFTER", "1.0"))
    shard = 0
    while time.monotonic() < end:
        shard += 1
        print(f"standin: Loading safetensors checkpoint shards: step {shard}", flush=True)
        time.sleep(every)
    print("standin: Capturing CUDA graphs (bs=256)", flush=True)  # the last line before the hang


if mode == "stall":
    threading.Thread(target=progress_then_stall, daemon=True).start()
if mode == "silent":
    while True:
        time.sleep(3600)
http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()
