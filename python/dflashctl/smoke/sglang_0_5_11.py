"""What the smoke depends on of SGLang 0.5.11's behaviour, read from its source. A new SGLang pin
re-reads each of these (README.md, "Changing a pin"); host/sglang_0_5_11.py and
service/sglang_0_5_11.py hold what host/ and the service depend on.

Elsewhere in the smoke, each named where it is used: the KV-pool rule servers started side by side
must meet (servers.py, the rule of service/sglang_0_5_11.pool_mib), the 48 running requests DFLASH
gets without --max-running-requests (sweep.py), DFLASH refusing constrained requests (grammar.py),
the drafter's fixed RoPE theta (oracle.py).
"""

import re

from dflashctl.service.sglang_0_5_11 import WARMED_UP_LINE

# Start-up log lines: `[YYYY-mm-dd HH:MM:SS(.mmm)( TP0…)] message`, milliseconds with LOG_MS_ENV=1.
LOG_MS_ENV = "SGLANG_LOG_MS"
LOG_STAMP = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)(?: [^\]]*)?\] (.*)$")
# (event, text the message starts with): srt/entrypoints/engine.py, srt/model_executor/model_runner.py,
# srt/entrypoints/http_server.py (smoke/startup.py says what each phase is).
START_UP_MARKERS = (
    ("args", "server_args=ServerArgs("),
    ("dist_begin", "Init torch distributed begin."),
    ("load_begin", "Load weight begin."),
    ("load_end", "Load weight end."),
    ("capture_begin", "Capture cuda graph begin."),
    ("capture_end", "Capture cuda graph end."),
    ("capture_begin", "Capture draft cuda graph begin."),
    ("capture_end", "Capture draft cuda graph end."),
    ("capture_begin", "Capture piecewise CUDA graph begin."),
    ("capture_end", "Capture piecewise CUDA graph end."),
    ("fired_up", WARMED_UP_LINE),
)

# A server whose port was taken: SGLang's HTTP server is uvicorn, which logs asyncio's "[Errno 98]
# error while attempting to bind on address ('127.0.0.1', PORT): address already in use" and exits 1
# (after the model has loaded: it binds last). Python's own OSError says "Address already in use".
PORT_TAKEN = re.compile(r"\[Errno 98\]|address already in use", re.IGNORECASE)
