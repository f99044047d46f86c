"""What the installed SGLang accepts, read from its source without importing it (no torch, no GPU).

The stack's interpreter may not be ours (the NixOS module validates against the package being
deployed), so the `sglang` probe (probe_child.py, shared with doctor and preflight) runs in a child
of `python` and parses the `choices` of SGLang's parser with `ast`.
"""

import sys

from dflashctl.errors import CONFIG, DflashError
from dflashctl.host import probes


def probe(python: str = sys.executable, timeout: float = 20.0) -> dict:
    """{"found": bool, "path": str, "choices": list | None} from the interpreter `python`."""
    r = probes.run_probe(python, "sglang", timeout=timeout)
    if r["ok"]:
        return {"found": True, "path": r["facts"]["server_args"],
                "choices": r["facts"]["speculative_algorithms"] or None}
    if probes.not_installed(r):
        return {"found": False}
    if "cannot run" in r.get("error", ""):
        raise DflashError(f"interpreter {python} does not exist", r["error"],
                          "pass the stack's python (…/bin/python of the dflash package)", CONFIG)
    raise DflashError(f"cannot read SGLang's speculative algorithms with {python}",
                      probes.failure_text(r), "check that the stack's interpreter runs", CONFIG)


def speculative_algorithms(python: str = sys.executable) -> set[str]:
    """Algorithms `--speculative-algorithm` accepts; empty if SGLang is absent or unreadable."""
    try:
        found = probe(python)
    except DflashError:
        return set()
    return set(found.get("choices") or ())
