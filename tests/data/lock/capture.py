"""Re-capture the offline fixtures from the live index (run by hand, rarely):

    python tests/data/lock/capture.py

Writes uv.lock (every URL replaced by its bare file name, the index replaced by "index", so the
fixture names no host) and torch-requires.json (torch's Requires-Dist per system).
"""

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "python"))

from dflashctl import resolver, spec as specmod  # noqa: E402
from dflashctl.lock.closure import closure  # noqa: E402


def sanitise(text: str) -> str:
    text = re.sub(r'url = "[^"]*/([^"/]+)"', r'url = "\1"', text)
    return re.sub(r'registry = "[^"]*"', 'registry = "index"', text)


def main() -> None:
    spec = specmod.load(HERE / "stack.toml")
    import tempfile, subprocess, os  # noqa: E401
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "pyproject.toml").write_text(resolver.project_toml(spec))
        subprocess.run([resolver.uv_binary(), "lock", "--python", sys.executable, "--directory", tmp],
                       check=True, env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"))
        raw = Path(tmp, "uv.lock").read_text()
    import tomllib
    uv_lock = tomllib.loads(raw)
    requires = {s: resolver.requires_dist(closure(uv_lock, spec, s).urls["torch"]) for s in spec.systems}
    text = sanitise(raw)
    assert "://" not in text, "a URL survived sanitising"
    (HERE / "uv.lock").write_text(text)
    (HERE / "torch-requires.json").write_text(json.dumps(requires, indent=2, sort_keys=True) + "\n")
    print(f"wrote {HERE / 'uv.lock'} and torch-requires.json")


if __name__ == "__main__":
    main()
