"""SIGINT and SIGTERM held back while a child process starts, so that a stop never loses a child.

dflashctl's handlers stop by raising (serve's stop, the CLI's Terminated, Ctrl-C's
KeyboardInterrupt), and Python runs a handler between any two bytecodes: also inside
subprocess.Popen, after the fork and before Popen returns. The exception then leaves Popen with the
child running (in a session of its own) and its pid in no variable, so no `finally` stops it: CI
saw a stand-in SGLang outlive the `serve` that a stop reached at that moment. Inside `deferred()`
the two signals are only noted; on leaving it the handlers are back and a noted signal is raised
again, so it is handled where the caller already holds the child.

Only the main thread runs Python handlers, so elsewhere `deferred()` does nothing; a handler that
Python did not install (None) or SIG_IGN is left alone, and so is SIG_DFL (it ends the process at
once, there is nothing to clean up after it).
"""

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOPS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    held = {}
    try:
        for s in STOPS:
            if callable(signal.getsignal(s)):
                held[s] = signal.signal(s, lambda signum, frame: noted.append(signum))
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(noted):  # each once, in the order they came
            signal.raise_signal(s)  # its handler runs here (and may raise) before raise_signal returns
