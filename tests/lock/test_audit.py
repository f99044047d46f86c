"""`dflashctl audit` offline, on wheels built here: tiny ELF libraries compiled with gcc, packed
into wheels with RECORDs, locked in a fixture lock and audited against the real overlay and
fix-ups (nix/audit.nix). One passing stack, then the three ways a pin bump breaks a Nix build."""

import base64
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, nix_or_skip

pytestmark = pytest.mark.nix

SYSTEM = {"x86_64": "x86_64-linux", "aarch64": "aarch64-linux"}.get(platform.machine())
PLATFORM_TAG = f"manylinux_2_17_{platform.machine()}"
DRIVER_PY = "    if env_libcuda_path := knobs.nvidia.libcuda_path:\n        return [env_libcuda_path]\n"
BUILD_PY = 'def _build():\n    cc = os.environ.get("CC")\n'


def gcc(tmp: Path, out: str, source: str, *flags: str) -> bytes:
    src = tmp / (out + ".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp / out), str(src), f"-L{tmp}", *flags],
                   check=True, capture_output=True)
    return (tmp / out).read_bytes()


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if shutil.which("gcc") is None or SYSTEM is None:
        pytest.skip("needs gcc on x86_64 or aarch64 Linux")
    tmp = tmp_path_factory.mktemp("elf")
    out = {"libdep.so.1": gcc(tmp, "libdep.so.1", "int dep(void) { return 1; }",
                              "-Wl,-soname,libdep.so.1")}
    shutil.copy(tmp / "libdep.so.1", tmp / "libdep.so")
    out["libuser.so"] = gcc(tmp, "libuser.so", "int dep(void); double cos(double);\n"
                            "double user(void) { return dep() + cos(0); }",
                            "-Wl,--no-as-needed", "-ldep", "-lm")
    gcc(tmp, "libmissing.so.1", "int gone(void) { return 2; }", "-Wl,-soname,libmissing.so.1")
    shutil.copy(tmp / "libmissing.so.1", tmp / "libmissing.so")
    # Extension modules link libpython, which buildPythonPackage's propagated python provides.
    gcc(tmp, "libpython3.12.so.1.0", "int Py_IsInitialized(void) { return 1; }",
        "-Wl,-soname,libpython3.12.so.1.0")
    shutil.copy(tmp / "libpython3.12.so.1.0", tmp / "libpython3.12.so")
    out["_ext.so"] = gcc(tmp, "_ext.so", "int Py_IsInitialized(void);\nint ext(void) { return Py_IsInitialized(); }",
                         "-Wl,--no-as-needed", "-lpython3.12")
    out["libbroken.so"] = gcc(tmp, "libbroken.so", "int gone(void);\nint broken(void) { return gone(); }",
                              "-Wl,--no-as-needed", "-lmissing")
    return out


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def make_wheel(where: Path, name: str, version: str, files: dict[str, bytes | str]) -> dict:
    """A wheel as a build backend writes one; returns its lock entry (without dependencies)."""
    dist = name.replace("-", "_")
    file = f"{dist}-{version}-py3-none-{PLATFORM_TAG}.whl"
    info = f"{dist}-{version}.dist-info"
    members = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
    record = "".join(f"{m},{record_hash(d)},{len(d)}\n" for m, d in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = where / file
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in members.items():
            z.writestr(member, data)
    data = path.read_bytes()
    return {"version": version, "file": file, "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "license": "MIT", "dependencies": []}


def stack(libs, where: Path, **changes) -> dict:
    """name -> lock entry of the passing fixture stack; `changes` replace or add packages."""
    pkgs = {
        "dep-lib": make_wheel(where, "dep-lib", "1.0", {"dep_lib/libdep.so.1": libs["libdep.so.1"]}),
        "user": make_wheel(where, "user", "1.0", {"user/__init__.py": "", "user/libuser.so": libs["libuser.so"],
                                                  "shared/user.json": "{}"}),
        "ext": make_wheel(where, "ext", "1.0", {"ext/_ext.cpython-312.so": libs["_ext.so"]}),
        # A library installed into $out/lib (the wheel's data scheme), found there by dependents.
        "data-lib": make_wheel(where, "data-lib", "1.0", {"data_lib-1.0.data/data/lib/libdep.so.1":
                                                          libs["libdep.so.1"]}),
        "triton": make_wheel(where, "triton", "3.6.0", {"triton/backends/nvidia/driver.py": DRIVER_PY,
                                                        "triton/runtime/build.py": BUILD_PY}),
        # Both ship build_backend.py; their fix-ups remove it, so there is no collision.
        "flashinfer-python": make_wheel(where, "flashinfer-python", "0.6.8.post1",
                                        {"build_backend.py": "# flashinfer\n", "flashinfer/__init__.py": ""}),
        "torch-c-dlpack-ext": make_wheel(where, "torch-c-dlpack-ext", "0.1.5",
                                         {"build_backend.py": "# dlpack\n", "torch_c_dlpack_ext/__init__.py": ""}),
        "pytest": make_wheel(where, "pytest", "9.0.3", {"pytest/__init__.py": ""}),
    }
    pkgs["user"]["dependencies"] = ["dep-lib"]
    pkgs["pytest"]["dev"] = True
    pkgs.update(changes)
    return pkgs


def write_lock(where: Path, packages: dict) -> Path:
    dev = [n for n, p in packages.items() if p.get("dev")]
    lock = {"version": 1, "spec_sha256": "0" * 64, "python": "3.12",
            "exclude_newer": "2026-05-08T00:00:00Z", "requirements": [],
            "systems": {SYSTEM: {"roots": sorted(set(packages) - set(dev)), "dev_roots": sorted(dev),
                                 "packages": packages}}}
    path = where / "lock.json"
    path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return path


def audit(lock: Path, wheels: Path, *extra: str) -> subprocess.CompletedProcess:
    nix_or_skip()
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    return subprocess.run([sys.executable, "-m", "dflashctl", "audit", "--lock", str(lock),
                           "--wheels", str(wheels), "--repo", str(REPO), *extra],
                          capture_output=True, text=True, env=env, timeout=300)


def test_fixture_stack_passes(libs, tmp_path):
    lock = write_lock(tmp_path, stack(libs, tmp_path))
    done = audit(lock, tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["systems"][SYSTEM]
    # libuser.so (libdep.so.1 from its dependency, libm from glibc), libdep.so.1 twice, _ext.so.
    assert report["elf_files"] == 4 and report["problems"] == []
    assert report["replacements"] == 2  # the real triton fix-up's two --replace-fail edits
    # The dev shell's .py files (user, flashinfer, torch-c-dlpack-ext, triton's two, pytest), each
    # compiled at levels 0 and 1; build_backend.py and its byte code removed by both fix-ups.
    assert report["bytecode_files"] == 12 and report["scripts"] == 0
    # A second run reads the cached scans, not the zips.
    assert sorted(p.name for p in tmp_path.glob("*.scan.json")) == sorted(
        p.name + ".scan.json" for p in tmp_path.glob("*.whl"))
    assert audit(lock, tmp_path).returncode == 0


def test_a_library_nobody_provides(libs, tmp_path):
    """(a) a new wheel links a library that no wheel, fix-up, glibc or ignore list provides."""
    broken = make_wheel(tmp_path, "broken", "1.0", {"broken/libbroken.so": libs["libbroken.so"]})
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, broken=broken)), tmp_path)
    assert done.returncode == 1
    assert (f"{SYSTEM}: broken-1.0-py3-none-{PLATFORM_TAG}.whl: broken/libbroken.so needs "
            f"libmissing.so.1, which autoPatchelf will not find") in done.stderr
    assert "overlays/fixups/broken.nix" in done.stderr and "Traceback" not in done.stderr


def test_a_dependency_that_goes_away_breaks_its_dependents(libs, tmp_path):
    pkgs = stack(libs, tmp_path)
    pkgs["user"]["dependencies"] = []  # a bump that drops the requirement on dep-lib
    done = audit(write_lock(tmp_path, pkgs), tmp_path)
    assert done.returncode == 1
    assert "user/libuser.so needs libdep.so.1" in done.stderr


def test_libraries_in_a_dependency_lib_directory_are_found(libs, tmp_path):
    """autoPatchelf's gatherLibraries searches $dep/lib: a library installed there (data scheme)
    satisfies a dependent; the same library deeper under $dep/share would not."""
    pkgs = stack(libs, tmp_path)
    pkgs["user"]["dependencies"] = ["data-lib"]
    assert audit(write_lock(tmp_path, pkgs), tmp_path).returncode == 0
    pkgs["data-lib"] = make_wheel(tmp_path, "data-lib", "1.0", {
        "data_lib-1.0.data/data/share/libdep.so.1": libs["libdep.so.1"]})
    done = audit(write_lock(tmp_path, pkgs), tmp_path)
    assert done.returncode == 1 and "user/libuser.so needs libdep.so.1" in done.stderr


def test_a_bump_whose_fixup_text_moved(libs, tmp_path):
    """(b) triton 3.7.0 rewrote the line the triton fix-up replaces."""
    triton = make_wheel(tmp_path, "triton", "3.7.0", {
        "triton/backends/nvidia/driver.py": "    if path := knobs.nvidia.libcuda_path:\n",
        "triton/runtime/build.py": BUILD_PY})
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, triton=triton)), tmp_path)
    assert done.returncode == 1
    assert ("overlays/fixups/triton.nix: substituteInPlace "
            "$out/lib/python3.12/site-packages/triton/backends/nvidia/driver.py --replace-fail "
            "'if env_libcuda_path := knobs.nvidia.libcuda_path:': the text is not in "
            "triton/backends/nvidia/driver.py of triton-3.7.0") in done.stderr
    assert "fix: update the fix-up for triton 3.7.0" in done.stderr
    assert "build.py" not in done.stderr  # the other replacement still matches


def test_two_wheels_installing_one_path(libs, tmp_path):
    """(c) a new wheel ships a file another wheel of the same environment ships, differently."""
    other = make_wheel(tmp_path, "other", "2.0", {"shared/user.json": '{"other": true}'})
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, other=other)), tmp_path)
    assert done.returncode == 1
    assert (f"{SYSTEM} dflash-env: lib/python3.12/site-packages/shared/user.json is installed by "
            f"both other-2.0-py3-none-{PLATFORM_TAG}.whl and user-1.0-py3-none-{PLATFORM_TAG}.whl "
            f"with different content") in done.stderr


def test_a_collision_only_the_dev_shell_has(libs, tmp_path):
    devtool = make_wheel(tmp_path, "devtool", "1.0", {"shared/user.json": "[]"})
    devtool["dev"] = True
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, devtool=devtool)), tmp_path)
    assert done.returncode == 1
    assert f"{SYSTEM} the dev shell: lib/python3.12/site-packages/shared/user.json" in done.stderr
    assert "dflash-env:" not in done.stderr


def test_identical_files_and_removed_files_are_no_collision(libs, tmp_path):
    twin = make_wheel(tmp_path, "twin", "1.0", {"shared/user.json": "{}"})  # same bytes as user's
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, twin=twin)), tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_wheel_that_differs_from_the_lock_is_refused(libs, tmp_path):
    pkgs = stack(libs, tmp_path)
    pkgs["user"]["sha256"] = "1" * 64
    done = audit(write_lock(tmp_path, pkgs), tmp_path)
    assert done.returncode == 1 and "does not match the lock" in done.stderr


def test_elf_reader_agrees_with_readelf(libs, tmp_path):
    from dflashctl.lock import elf

    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    for name, data in libs.items():
        (tmp_path / name).write_bytes(data)
        with open(tmp_path / name, "rb") as f:
            info = elf.read(f)
        out = subprocess.run(["readelf", "-dW", str(tmp_path / name)], capture_output=True, text=True).stdout
        needed = tuple(line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line)
        assert info.needed == needed and info.patched and info.machine == platform.machine()
    assert elf.read(open(tmp_path / "libuser.so", "rb")).needed[:1] == ("libdep.so.1",)


def test_fixup_script_effects():
    from dflashctl.lock.fixup_scripts import effects

    e = effects("""
      t=$out/lib/site/triton
      substituteInPlace $t/a.py --replace-fail 'x = 1' 'x = 2' \\
        --replace-warn "y" "z"
      rm -f ${t}/b.py \\
        $out/c/*.pyc
      echo 'substituteInPlace not/a/command'
    """)
    assert [(r.path, r.old, r.new, r.must_match) for r in e.replacements] == [
        ("$out/lib/site/triton/a.py", "x = 1", "x = 2", True),
        ("$out/lib/site/triton/a.py", "y", "z", False)]
    assert e.removed == ("$out/lib/site/triton/b.py", "$out/c/*.pyc")


def test_multi_line_quoted_replacements_are_read_not_skipped():
    """The nvidia-ml-py and cuda-pathfinder fix-ups replace indented blocks quoted across lines;
    read line by line they were skipped and the audit checked nothing of them."""
    from dflashctl.lock import fixup_scripts
    script = ("x=$out/lib\nsubstituteInPlace $x/a.py --replace-fail '\n    a = 1\n' '\n    try:\n"
              "        a = 1\n    except OSError:  # \"quoted\"\n        a = 2\n'\nrm -f $out/b # gone\n")
    fx = fixup_scripts.effects(script)
    assert fx.replacements == (fixup_scripts.Replacement(
        "$out/lib/a.py", "\n    a = 1\n",
        '\n    try:\n        a = 1\n    except OSError:  # "quoted"\n        a = 2\n', True),)
    assert fx.removed == ("$out/b",)


def entry_points(*scripts: str) -> str:
    return "[console_scripts]\n" + "".join(f"{s} = tool.cli:main\n" for s in scripts)


def test_the_same_py_in_two_wheels_collides_as_byte_code(libs, tmp_path):
    """Identical .py files at one path are no collision, but the install hook compiles each into a
    .pyc naming its own package's store path: those differ."""
    same = "def f():\n    return 1\n"
    a = make_wheel(tmp_path, "twin-a", "1.0", {"common/same.py": same, "common/a.json": "{}"})
    b = make_wheel(tmp_path, "twin-b", "1.0", {"common/same.py": same})
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, **{"twin-a": a, "twin-b": b})), tmp_path)
    assert done.returncode == 1
    assert (f"{SYSTEM} dflash-env: lib/python3.12/site-packages/common/__pycache__/same.cpython-312.pyc "
            f"is installed by both twin_a-1.0-py3-none-{PLATFORM_TAG}.whl and "
            f"twin_b-1.0-py3-none-{PLATFORM_TAG}.whl with different content (byte code the install "
            "hook compiles for each of them") in done.stderr
    assert "common/__pycache__/same.cpython-312.opt-1.pyc" in done.stderr
    assert "common/same.py is installed" not in done.stderr  # the sources themselves are equal


def test_a_fixup_that_removes_a_py_but_not_its_byte_code(libs, tmp_path):
    """The install hook compiles before a fix-up's postInstall runs: removing the .py alone leaves
    its .pyc, which still collides; removing both (as flashinfer-python's fix-up does) does not."""
    fixups = tmp_path / "fixups"
    shutil.copytree(REPO / "overlays" / "fixups", fixups)
    same = "X = 1\n"
    pkgs = stack(libs, tmp_path, **{
        "twin-a": make_wheel(tmp_path, "twin-a", "1.0", {"common/same.py": same}),
        "twin-b": make_wheel(tmp_path, "twin-b", "1.0", {"common/same.py": same})})
    lock = write_lock(tmp_path, pkgs)
    site = "$out/${python.sitePackages}"
    (fixups / "twin-b.nix").write_text(
        "{ python, ... }:\nprev: {\n  postInstall = (prev.postInstall or \"\") + ''\n"
        f"    rm -f {site}/common/same.py\n  '';\n}}\n")
    done = audit(lock, tmp_path, "--fixups", str(fixups))
    assert done.returncode == 1
    assert "common/__pycache__/same.cpython-312.pyc is installed by both" in done.stderr
    (fixups / "twin-b.nix").write_text(
        "{ python, ... }:\nprev: {\n  postInstall = (prev.postInstall or \"\") + ''\n"
        f"    rm -f {site}/common/same.py {site}/common/__pycache__/same.*.pyc\n  '';\n}}\n")
    done = audit(lock, tmp_path, "--fixups", str(fixups))
    assert done.returncode == 0, done.stderr


def test_two_wheels_with_one_entry_point_script(libs, tmp_path):
    """console_scripts become bin/NAME in each package (wrapped with its own store path): one name
    in two wheels collides, as does a script a wheel ships in its .data/scripts."""
    a = make_wheel(tmp_path, "tool-a", "1.0", {"tool_a/__init__.py": "",
                                               "tool_a-1.0.dist-info/entry_points.txt": entry_points("tool", "a-only")})
    b = make_wheel(tmp_path, "tool-b", "1.0", {"tool_b/__init__.py": "",
                                               "tool_b-1.0.dist-info/entry_points.txt": entry_points("tool")})
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, **{"tool-a": a, "tool-b": b})), tmp_path)
    assert done.returncode == 1
    assert (f"{SYSTEM} dflash-env: bin/tool is installed by both tool_a-1.0-py3-none-{PLATFORM_TAG}.whl "
            f"and tool_b-1.0-py3-none-{PLATFORM_TAG}.whl with different content (an entry-point "
            "script of each") in done.stderr
    assert "bin/a-only" not in done.stderr
    c = make_wheel(tmp_path, "tool-b", "1.0", {"tool_b/__init__.py": "",
                                               "tool_b-1.0.data/scripts/a-only": "#!/bin/sh\n"})
    done = audit(write_lock(tmp_path, stack(libs, tmp_path, **{"tool-a": a, "tool-b": c})), tmp_path, "--json")
    assert done.returncode == 1
    assert "bin/a-only is installed by both" in done.stderr
    a_alone = audit(write_lock(tmp_path, stack(libs, tmp_path, **{"tool-a": a})), tmp_path, "--json")
    assert a_alone.returncode == 0, a_alone.stderr
    assert json.loads(a_alone.stdout)["systems"][SYSTEM]["scripts"] == 2
