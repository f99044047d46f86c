"""What the installed SGLang accepts, read from its source without importing it (no torch, no GPU).

The stack's interpreter may not be ours (the NixOS module validates against the package being
deployed), so a child of `python` finds `sglang/srt/server_args.py` and parses the `choices` of
`--speculative-algorithm` with `ast`.
"""

import json
import subprocess
import sys

from dflashctl.errors import CONFIG, DflashError

# Runs in the target interpreter: stdlib only, prints one JSON object.
_FIND_CHOICES = r'''
import ast, importlib.util, json, os, sys
spec = importlib.util.find_spec("sglang")  # a top-level find_spec executes nothing
if spec is None or not spec.submodule_search_locations:
    print(json.dumps({"found": False})); sys.exit()
path = os.path.join(list(spec.submodule_search_locations)[0], "srt", "server_args.py")
tree = ast.parse(open(path, encoding="utf-8").read())
names = {}
for node in ast.walk(tree):
    if isinstance(node, ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Name):
                names[t.id] = node.value
def strings(node):
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None
choices = None
for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
            and any(isinstance(a, ast.Constant) and a.value == "--speculative-algorithm" for a in node.args)):
        for kw in node.keywords:
            if kw.arg == "choices":
                choices = strings(kw.value)
print(json.dumps({"found": True, "path": path, "choices": choices}))
'''


def probe(python: str = sys.executable, timeout: float = 20.0) -> dict:
    """{"found": bool, "path": str, "choices": list | None} from the interpreter `python`."""
    try:
        out = subprocess.run([python, "-c", _FIND_CHOICES], capture_output=True, text=True,
                             timeout=timeout, check=True).stdout
        return json.loads(out)
    except FileNotFoundError:
        raise DflashError(f"interpreter {python} does not exist", "",
                          "pass the stack's python (…/bin/python of the dflash package)", CONFIG)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise DflashError(f"cannot read SGLang's speculative algorithms with {python}",
                          detail.strip().splitlines()[-1] if detail.strip() else "no output",
                          "check that the stack's interpreter runs", CONFIG)


def speculative_algorithms(python: str = sys.executable) -> set[str]:
    """Algorithms `--speculative-algorithm` accepts; empty if SGLang is absent or unreadable."""
    try:
        found = probe(python)
    except DflashError:
        return set()
    return set(found.get("choices") or ())
