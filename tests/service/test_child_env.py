"""service/child_env.py: the SGLang child's one environment, and smoke starting its servers in it.

The driver directory is a fake one on this machine's disk (tests/fakehost.py); the kernel module's
version is this machine's (none without an NVIDIA driver, so any version is accepted)."""

import os
import sys
from pathlib import Path

import pytest

from dflashctl import cli, errors
from dflashctl.host import driver
from dflashctl.service import config, sglang_args
from dflashctl.service.child_env import child_env
from dflashctl.smoke import fleet, options, settings
from fakehost import V580, install_driver

KERNEL = Path("/proc/driver/nvidia/version")


@pytest.fixture
def fake_driver(tmp_path) -> Path:
    if KERNEL.exists() and V580 not in KERNEL.read_text():
        pytest.skip("this machine's NVIDIA kernel module is another version than the fake driver's")
    d = tmp_path / "nvidia"
    install_driver(Path("/"), str(d), V580)
    return d


def base_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (driver.ENV, "DFLASH_PREBUILT_KERNELS", "CUDA_HOME", "CUDA_PATH")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), LD_LIBRARY_PATH="/some/where")
    return env


def instance(**extra) -> config.InstanceConfig:
    return config.from_dict({"name": "a", "model": "/models/target", "port": 30000, **extra}, "a")


def test_driver_library_dir_is_honoured(tmp_path, fake_driver):
    child = child_env(instance(driverLibraryDir=str(fake_driver)), sys.executable, base_env(tmp_path))
    assert (child.driver.directory, child.driver.found_by) == (str(fake_driver), "driverLibraryDir")
    first, rest = child.env["LD_LIBRARY_PATH"].split(os.pathsep, 1)
    assert Path(first).is_relative_to(tmp_path / "cache" / "dflashctl") and rest == "/some/where"
    assert sorted(p.name for p in Path(first).iterdir()) == sorted(child.driver.links)
    assert str(fake_driver) in child.driver_line() and "driverLibraryDir" in child.driver_line()


def test_a_driver_library_dir_without_a_driver_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(errors.DflashError) as e:
        child_env(instance(driverLibraryDir=str(empty)), sys.executable, base_env(tmp_path))
    assert e.value.exit_code == errors.PREFLIGHT_DRIVER and str(empty) in e.value.what


def test_the_mapped_environment_is_kept_and_the_token_added(tmp_path):
    cfg = instance(gpus=[1], environment={"FOO": "bar"})
    child = child_env(cfg, sys.executable, base_env(tmp_path), hf_token="hf_x")
    mapped = sglang_args.build_env(cfg, base_env(tmp_path), "hf_x")
    assert {k: child.env[k] for k in ("CUDA_VISIBLE_DEVICES", "FOO", "HF_TOKEN")} == {
        "CUDA_VISIBLE_DEVICES": "1", "FOO": "bar", "HF_TOKEN": "hf_x"}
    assert child.env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)  # the stack's bin/
    assert set(mapped) <= set(child.env)


def test_smoke_starts_its_server_in_serves_child_environment(tmp_path, fake_driver, monkeypatch):
    """A smoke server's environment is exactly what serve would give the same settings: here the
    driver found through $DFLASH_DRIVER_LIBRARY_DIR is first on its LD_LIBRARY_PATH."""
    for k, v in base_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(driver.ENV, str(fake_driver))
    argv = ["smoke", "--pair", "random", "--python", sys.executable, "--triton-cache", "none"]
    o = options.from_args(cli.build_parser(argv).parse_args(argv))
    spec = settings.RunSpec("baseline", None, str(tmp_path / "target"))
    started: list[fleet.Started] = []
    try:
        s = fleet.start_server(o, spec, "sequential", tmp_path, started)  # no SGLang here: it exits at once
    finally:
        fleet.stop_all(started)
    assert s.server.env == child_env(s.cfg, sys.executable).env
    assert s.server.env["LD_LIBRARY_PATH"].split(os.pathsep)[1] == "/some/where"
    assert s.server.env["SGLANG_LOG_MS"] == "1"  # the smoke's own setting, on top of serve's
