"""Whether a `--python` can be used at all, asked once before anything runs in it.

A path that does not exist, is not executable or is not a Python 3 would otherwise surface as the
first probe's failure ("driver: NVML failed"), under the wrong exit code and with the wrong fix;
here it is named as what it is, a wrong setting. The question is the `python` probe itself (the way
every probe child runs: `python -c SOURCE python`), so an interpreter that answers it runs the rest;
modules a caller needs are asked in one more short child (`find_spec` of a package does not import it).
"""

import os
import subprocess

from dflashctl.host import probes

TIMEOUT_S = 30.0  # a cold interpreter on a loaded host starts in well under a second
_FIND = ("import importlib.util, sys\n"
         "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))\n")


def problem(python: str, modules: tuple[str, ...] = ()) -> str | None:
    """Why `python` cannot run our children (or lacks one of `modules`), or None when it can."""
    if not python:
        return "no path given"
    if not os.path.exists(python):
        return f"{python} does not exist"
    if os.path.isdir(python):
        return f"{python} is a directory"
    if not os.access(python, os.X_OK):
        return f"{python} is not executable"
    answer = probes.run_probe(python, "python", timeout=TIMEOUT_S)
    version = str(answer.get("facts", {}).get("version", ""))
    if not answer.get("ok") or not version.startswith("3."):
        said = probes.failure_text(answer) if answer.get("error") else "it ran, but gave no answer"
        return f"{python} is not a Python 3 interpreter ({said})"
    if not modules:
        return None
    try:
        p = subprocess.run([python, "-c", _FIND, *modules], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=TIMEOUT_S, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} could not be asked for {', '.join(modules)}: {e}"
    missing = p.stdout.split() if p.returncode == 0 else list(modules)
    if missing:
        return f"{python} (Python {version}) has no {', '.join(missing)}"
    return None
