"""The fix-ups that let locked packages find the driver on NixOS without environment variables
(overlays/fixups/nvidia-ml-py.nix, cuda-pathfinder.nix), run as the build runs them: the fix-up's
postInstall, evaluated by Nix, executed by bash with a substituteInPlace that has nixpkgs'
--replace-fail meaning (every occurrence; fail when there is none).

Goldens: the patched text of a small excerpt of each real file (tests/data/fixups/); with network,
the real wheel from the lock, patched, then loading a real (fake) NVML from the driver link
directory with no LD_LIBRARY_PATH. tests/regenerate rewrites the goldens.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, nix_or_skip, update_golden
from fakehost import V580, fake_nvml
from fixup_shell import locked_wheel, run_script, unpack
from nixeval import eval_expr

DATA = REPO / "tests/data/fixups"
SITE = "lib/python3.12/site-packages"
# fix-up -> (the file it patches inside site-packages, its excerpt in tests/data/fixups)
PATCHED = {"nvidia-ml-py": "pynvml.py",
           "cuda-pathfinder": "cuda/pathfinder/_dynamic_libs/load_dl_linux.py"}


def post_install(name: str, driver_link: str) -> str:
    expr = (f'((import {REPO}/overlays/fixups/{name}.nix {{ python.sitePackages = "{SITE}"; '
            f'driverLink = "{driver_link}"; }}) {{ }}).postInstall')
    return eval_expr(nix_or_skip(), expr)


def run_fixup(name: str, out: Path, driver_link: str = "/run/opengl-driver") -> subprocess.CompletedProcess:
    return run_script(post_install(name, driver_link), out)


@pytest.mark.golden
@pytest.mark.nix
@pytest.mark.parametrize("name", sorted(PATCHED))
def test_golden_patched_excerpt(name, tmp_path):
    target = tmp_path / SITE / PATCHED[name]
    target.parent.mkdir(parents=True)
    excerpt = DATA / Path(PATCHED[name]).name
    shutil.copy(excerpt, target)
    done = run_fixup(name, tmp_path)
    assert done.returncode == 0, done.stderr
    golden = DATA / (Path(PATCHED[name]).name + ".patched")
    update_golden(golden, target.read_text())
    assert target.read_text() == golden.read_text()
    assert "/run/opengl-driver/lib/" in golden.read_text()
    compile(golden.read_text(), str(golden), "exec")  # still Python
    assert run_fixup(name, tmp_path).returncode != 0  # the pattern is gone: --replace-fail stops a rebuild


# ---------------------------------------------------------------- the real wheels, with network

def python_without_driver_path(site: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    return subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=60)


# (locked package, code run without LD_LIBRARY_PATH, its error before the fix-up, what it prints after)
LOADERS = [
    ("nvidia-ml-py", "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlSystemGetDriverVersion())",
     "NVMLError_LibraryNotFound", lambda lib: V580),
    ("cuda-pathfinder",
     "from cuda.pathfinder import load_nvidia_dynamic_lib as load; print(load('nvml').abs_path)",
     "DynamicLibNotFoundError", lambda lib: str(lib)),
]


@pytest.mark.nix
@pytest.mark.network
@pytest.mark.parametrize("package, code, error, expected", LOADERS, ids=[x[0] for x in LOADERS])
def test_the_fixup_finds_nvml_in_the_driver_link_dir(tmp_path, package, code, error, expected):
    driver_link = tmp_path / "opengl-driver"
    lib = driver_link / "lib/libnvidia-ml.so.1"
    fake_nvml(lib, tmp_path)
    wheel = locked_wheel(package, tmp_path)
    plain = python_without_driver_path(unpack(wheel, tmp_path / "plain"), code)
    assert plain.returncode != 0 and error in plain.stderr
    site = unpack(wheel, tmp_path / "fixed")
    assert run_fixup(package, tmp_path / "fixed", str(driver_link)).returncode == 0
    fixed = python_without_driver_path(site, code)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.strip() == expected(lib)
