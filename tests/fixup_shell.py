"""A fix-up's install script run as stdenv runs it, for tests: bash with a substituteInPlace that
has nixpkgs' meaning (every occurrence of OLD replaced; --replace-fail stops the build when there
is none, --replace-warn says so and goes on), $out set, and the interpreter the script names
(python3.12) being this one."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO

SITE = "lib/python3.12/site-packages"

SUBSTITUTE_IN_PLACE = r'''
substituteInPlace() {
  "$PYTHON" - "$@" <<'EOF'
import sys
path, args = sys.argv[1], sys.argv[2:]
text = open(path).read()
while args:
    flag, old, new, args = args[0], args[1], args[2], args[3:]
    assert flag in ("--replace-fail", "--replace-warn"), flag
    if old not in text:
        if flag == "--replace-fail":
            sys.exit(f"substituteInPlace: pattern {old!r} not found in {path}")
        print(f"substituteInPlace: warning: pattern {old!r} not found in {path}", file=sys.stderr)
    text = text.replace(old, new)
open(path, "w").write(text)
EOF
}
'''


def run_script(script: str, out: Path) -> subprocess.CompletedProcess:
    """`script` under `set -eu`, with $out = `out`."""
    shim = out.parent / f"{out.name}-bin"
    shim.mkdir(parents=True, exist_ok=True)
    if not (shim / "python3.12").exists():
        (shim / "python3.12").symlink_to(sys.executable)
    env = {**os.environ, "out": str(out), "PYTHON": sys.executable, "PATH": f"{shim}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", "set -eu\n" + SUBSTITUTE_IN_PLACE + script], env=env,
                          capture_output=True, text=True)


def locked_wheel(name: str, dest: Path) -> Path:
    """The lock's wheel of `name`, downloaded by file name and sha256 as test_lock_network does."""
    from dflashctl.lock import lockfile
    from dflashctl.lock.export import requirements_text
    lock = lockfile.load(REPO / "nix/python-lock.json")
    line = next(ln for ln in requirements_text(lock, "x86_64-linux").splitlines() if ln.startswith(f"{name}=="))
    (dest / "req.txt").write_text(line + "\n")
    # the stack's Python 3.12 wheel, whatever Python runs the tests: its tags, from its file name
    file = lock.systems["x86_64-linux"][name].file
    abi, platforms = file[:-len(".whl")].split("-")[-2:]
    target = [] if platforms == "any" else [
        "--implementation", "cp", "--python-version", "3.12", "--abi", abi,
        *[arg for p in platforms.split(".") for arg in ("--platform", p)]]
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
                        "--only-binary=:all:", *target, "-r", str(dest / "req.txt"), "-d", str(dest / "dl")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (wheel,) = (dest / "dl").iterdir()
    assert wheel.name == file
    return wheel


def unpack(wheel: Path, out: Path) -> Path:
    site = out / SITE
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site
