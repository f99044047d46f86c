"""Driver discovery over fake host trees (tests/fakehost.py): which directory is chosen on each kind
of host, and exactly which links the child's LD_LIBRARY_PATH directory holds."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl import errors
from dflashctl.host import driver, ld_cache
from fakehost import (I386, SYSTEM, V570, V580, X86_64, expected, fake_nvml, install_driver,
                      install_system_libs, kernel_module, ld_so_cache, link, links_of, touch)

MULTIARCH = "/usr/lib/x86_64-linux-gnu"
CONTAINER = "/usr/local/nvidia/lib64"


def discover_links(root: Path, tmp_path: Path, **kw) -> tuple[driver.Driver, dict[str, str]]:
    drv = driver.discover(root, env=kw.pop("env", {}), machine="x86_64", **kw)
    assert drv is not None
    made = driver.link_dir(drv, tmp_path / "cache")
    return drv, links_of(made, root)


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "host"
    r.mkdir()
    return r


def test_nixos(root, tmp_path):
    # /run/opengl-driver is a link into the store; the driver's own files sit next to libGL & co.
    store = "/nix/store/abc-nvidia-x11-580.159.04/lib"
    install_driver(root, store, V580)
    install_system_libs(root, store)
    touch(root / store.lstrip("/") / "libEGL_nvidia.so.0")
    link(root / "run/opengl-driver", "/nix/store/abc-nvidia-x11-580.159.04")
    kernel_module(root, V580)
    drv, links = discover_links(root, tmp_path)
    assert (drv.directory, drv.found_by, drv.version, drv.kernel_version) == \
        ("/run/opengl-driver/lib", "NixOS", V580, V580)
    assert links == expected(store, V580)


def test_debian_multiarch_through_ld_so_cache(root, tmp_path):
    # The i386 copy comes first in the cache and must be passed over for the x86-64 one.
    install_driver(root, "/usr/lib/i386-linux-gnu", V580)
    install_driver(root, MULTIARCH, V580)
    install_system_libs(root, MULTIARCH)
    link(root / "lib", "usr/lib")  # usrmerge: the cache names /lib/x86_64-linux-gnu
    ld_so_cache(root, [("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", I386),
                       ("libcuda.so.1", "/lib/x86_64-linux-gnu/libcuda.so.1", X86_64),
                       ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", X86_64)])
    kernel_module(root, V580, open_module=True)
    drv, links = discover_links(root, tmp_path)
    assert (drv.directory, drv.found_by, drv.version) == ("/lib/x86_64-linux-gnu", "ld.so.cache", V580)
    assert links == expected(MULTIARCH, V580)
    assert not set(SYSTEM) & set(links)  # never the host's glibc or libstdc++


def test_lib64_by_scan(root, tmp_path):
    install_driver(root, "/usr/lib64", V580, dev_links=False)
    install_system_libs(root, "/usr/lib64")
    kernel_module(root, V580)
    drv, links = discover_links(root, tmp_path)
    assert (drv.directory, drv.found_by) == ("/usr/lib64", "scan")
    assert links == expected("/usr/lib64", V580, dev=False)


def test_container_mount(root, tmp_path):
    # The H200 image: the driver in /usr/local/nvidia/lib64, /lib/libcuda.so.1 a link into it.
    install_driver(root, CONTAINER, V580)
    link(root / "lib/libcuda.so.1", f"{CONTAINER}/libcuda.so.1")
    install_system_libs(root, MULTIARCH)
    kernel_module(root, V580)
    drv, links = discover_links(root, tmp_path)
    assert (drv.directory, drv.found_by) == (CONTAINER, "scan")
    assert links == expected(CONTAINER, V580)


def test_wsl(root, tmp_path):
    # WSL: plain files with their own numbering, libdxcore beside them, no /proc/driver/nvidia.
    wsl = "/usr/lib/wsl/lib"
    for name in ("libcuda.so", "libcuda.so.1", "libcuda.so.1.1", "libnvidia-ml.so.1", "libdxcore.so",
                 "libd3d12.so", "libnvidia-ptxjitcompiler.so.1"):
        touch(root / wsl.lstrip("/") / name)
    drv, links = discover_links(root, tmp_path)
    assert (drv.directory, drv.version, drv.kernel_version) == (wsl, None, None)
    assert links == {n: f"{wsl}/{n}" for n in ("libcuda.so", "libcuda.so.1", "libcuda.so.1.1",
                                               "libdxcore.so", "libnvidia-ml.so.1",
                                               "libnvidia-ptxjitcompiler.so.1")}


def test_no_driver(root):
    install_system_libs(root, MULTIARCH)
    touch(root / "usr/local/cuda/lib64/stubs/libcuda.so")  # a toolkit stub is not a driver
    assert driver.discover(root, env={}, machine="x86_64") is None


def test_version_mismatch_is_a_clear_error(root):
    install_driver(root, MULTIARCH, V570)
    kernel_module(root, V580)
    with pytest.raises(errors.DflashError) as e:
        driver.discover(root, env={}, machine="x86_64")
    assert e.value.exit_code == errors.PREFLIGHT_DRIVER
    assert f"kernel module {V580}" in e.value.what
    assert f"{V570} in {MULTIARCH}" in e.value.why and "reboot" in e.value.fix


def test_stale_directory_is_passed_over(root, tmp_path):
    # An old driver's libraries left in the multiarch dir (first in ld.so.cache); the loaded one
    # is in the container mount.
    install_driver(root, MULTIARCH, V570)
    install_driver(root, CONTAINER, V580)
    ld_so_cache(root, [("libcuda.so.1", f"{MULTIARCH}/libcuda.so.1", X86_64)])
    kernel_module(root, V580)
    drv, links = discover_links(root, tmp_path)
    assert (drv.directory, drv.version) == (CONTAINER, V580)
    assert links == expected(CONTAINER, V580)


def test_directory_holding_two_versions(root, tmp_path):
    # Both versions in one directory, the soname links still at the old one: only the loaded
    # version is linked, under the loader's names of libcuda and NVML.
    install_driver(root, MULTIARCH, V570)
    install_driver(root, "/tmp-new", V580, dev_links=False)
    for stem, _ in (("libcuda", 0), ("libnvidia-ml", 0), ("libnvidia-gpucomp", 0)):
        shutil.move(root / f"tmp-new/{stem}.so.{V580}", root / MULTIARCH.lstrip("/") / f"{stem}.so.{V580}")
    kernel_module(root, V580)
    drv, links = discover_links(root, tmp_path)
    real = {s: f"{MULTIARCH}/{s}.so.{V580}" for s in ("libcuda", "libnvidia-ml", "libnvidia-gpucomp")}
    assert links == {f"libcuda.so.{V580}": real["libcuda"], "libcuda.so.1": real["libcuda"],
                     f"libnvidia-ml.so.{V580}": real["libnvidia-ml"], "libnvidia-ml.so.1": real["libnvidia-ml"],
                     f"libnvidia-gpucomp.so.{V580}": real["libnvidia-gpucomp"]}


def test_explicit_setting_wins_and_must_hold_a_driver(root, tmp_path):
    install_driver(root, "/run/opengl-driver/lib", V580)
    install_driver(root, "/opt/nvidia", V580)
    kernel_module(root, V580)
    drv, _ = discover_links(root, tmp_path, setting="/opt/nvidia")
    assert (drv.directory, drv.found_by) == ("/opt/nvidia", "driverLibraryDir")
    drv, _ = discover_links(root, tmp_path, env={driver.ENV: "/opt/nvidia"})
    assert drv.found_by == f"${driver.ENV}"
    with pytest.raises(errors.DflashError) as e:
        driver.discover(root, setting="/usr/lib64", env={}, machine="x86_64")
    assert e.value.exit_code == errors.PREFLIGHT_DRIVER and "/usr/lib64" in e.value.what


def test_link_dir_is_reused_until_the_driver_changes(root, tmp_path):
    install_driver(root, CONTAINER, V580)
    kernel_module(root, V580)
    drv = driver.discover(root, env={}, machine="x86_64")
    first = driver.link_dir(drv, tmp_path / "cache")
    assert driver.link_dir(drv, tmp_path / "cache") == first
    lib = root / CONTAINER.lstrip("/") / f"libcuda.so.{V580}"
    lib.write_bytes(b"upgraded")  # same version string, other bytes: a new directory
    assert driver.link_dir(drv, tmp_path / "cache") != first


def test_provide_puts_only_the_link_dir_first(root, tmp_path):
    install_driver(root, CONTAINER, V580)
    kernel_module(root, V580)
    env = {"HOME": str(tmp_path / "home"), "LD_LIBRARY_PATH": "/some/where"}
    out, drv = driver.provide(env, root=root)
    first, rest = out["LD_LIBRARY_PATH"].split(os.pathsep, 1)
    assert Path(first).parent == tmp_path / "home/.cache/dflashctl" and rest == "/some/where"
    assert links_of(Path(first), root) == expected(CONTAINER, V580)
    assert env["LD_LIBRARY_PATH"] == "/some/where"  # the caller's env is not changed
    again, _ = driver.provide(out, root=root)
    assert again["LD_LIBRARY_PATH"] == out["LD_LIBRARY_PATH"]  # idempotent


# ------------------------------------------------------------------------------ ld.so.cache

def ldconfig_or_skip() -> str:
    for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.access(p, os.X_OK):
            return p
    pytest.skip("no ldconfig on this machine")


def real_library() -> Path:
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64"):
        for name in ("libz.so.1", "libm.so.6"):
            if (Path(d) / name).exists():
                return Path(d) / name
    pytest.skip("no libz.so.1 or libm.so.6 to index")


def old_only(cache: Path) -> Path:
    """A compat cache with its new-format part made unreadable (its magic blanked): the layout
    glibc wrote before 2.32, which glibc's reader then takes the old entries from."""
    data = bytearray(cache.read_bytes())
    at = data.find(ld_cache.NEW_MAGIC)
    assert at > 0, "ldconfig -c compat wrote no new-format part"
    data[at:at + len(ld_cache.NEW_MAGIC)] = bytes(len(ld_cache.NEW_MAGIC))
    out = cache.with_name("cache-old")
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("layout", ["new", "compat", "old"])
def test_ld_cache_reads_what_glibc_reads(tmp_path, layout):
    """Each layout's parse against glibc's own reader (`ldconfig -p`) of that same file, entry for
    entry. The old part of a compat cache may list other entries than its new part (seen: one more
    ld-linux-x86-64.so.2), so neither part is compared with the other."""
    ldconfig = ldconfig_or_skip()
    lib = tmp_path / "lib"
    lib.mkdir()
    src = real_library()
    shutil.copy(src.resolve(), lib / src.name)
    (tmp_path / "conf").write_text(f"{lib}\n")
    cache = tmp_path / "cache"
    subprocess.run([ldconfig, "-X", "-c", "new" if layout == "new" else "compat", "-C", str(cache),
                    "-f", str(tmp_path / "conf")], check=True)
    if layout == "old":
        cache = old_only(cache)
    entries = ld_cache.parse(cache.read_bytes())
    listed = subprocess.run([ldconfig, "-p", "-C", str(cache)], capture_output=True, text=True,
                            check=True).stdout.splitlines()[1:]
    assert [(e.soname, e.path) for e in entries] == \
        [(line.split(" (")[0].strip(), line.split(" => ")[1]) for line in listed if " => " in line]
    assert (src.name, str(lib / src.name)) in [(e.soname, e.path) for e in entries]


def test_ld_cache_refuses_other_files():
    with pytest.raises(ValueError):
        ld_cache.parse(b"\x7fELF not a cache")
    with pytest.raises(ValueError):
        ld_cache.parse(ld_cache.NEW_HEADER.pack(ld_cache.NEW_MAGIC, 1000, 0, 2, 0))


# ------------------------------------------------------------- a real dlopen through the links



def test_the_nvml_probe_loads_the_driver_only_through_discovery(root, tmp_path):
    """A driver in a directory no loader searches (the NixOS case): the probe child fails as on a
    host without a driver, and loads it by soname once provide() set up its environment."""
    directory = root / "run/opengl-driver/lib"
    fake_nvml(directory / f"libnvidia-ml.so.{V580}", tmp_path)
    link(directory / "libnvidia-ml.so.1", f"libnvidia-ml.so.{V580}")
    kernel_module(root, V580)
    from dflashctl.host import probes
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home")}
    without = probes.run_probe(sys.executable, "driver", env=env)
    check = probes.check_driver(without)
    assert (check.status, check.summary) == ("fail", "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)")
    assert check.fix
    child_env, found = driver.provide(env, root=root)
    assert found.found_by == "NixOS"
    r = probes.run_probe(sys.executable, "driver", env=child_env)
    assert r["ok"], r
    assert r["facts"]["version"] == V580 and r["facts"]["cuda"] == "13.0"


def test_doctor_lines(root, tmp_path):
    none = driver.check(driver.discover(root, env={}, machine="x86_64"))
    assert none.status == "warn" and "/run/opengl-driver/lib" in none.summary and "driverLibraryDir" in none.fix
    install_driver(root, MULTIARCH, V570)
    kernel_module(root, V580)
    _, found = driver.locate({"HOME": str(tmp_path)}, root=root)
    bad = driver.check(found)
    assert (bad.status, bad.exit_code) == ("fail", errors.PREFLIGHT_DRIVER) and "reboot" in bad.fix
    install_driver(root, CONTAINER, V580)
    good = driver.check(driver.locate({"HOME": str(tmp_path)}, root=root)[1])
    assert (good.status, good.summary) == \
        ("ok", f"driver {V580} in {CONTAINER} (found by scan), {len(expected(CONTAINER, V580))} libraries")
