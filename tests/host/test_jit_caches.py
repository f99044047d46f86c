"""Every JIT cache of the stack is named for SGLang's child, under the instance's cache directory."""

from pathlib import Path

import pytest

from dflashctl.errors import CONFIG, DflashError
from dflashctl.host import jit_caches
from dflashctl.service import config, sglang_args

UNIT = {"PATH": "/usr/bin", "HOME": "/var/cache/dflash-a",
        "CACHE_DIRECTORY": "/var/cache/dflash-a:/var/cache/hf"}  # what systemd gives the service


def child_env(settings: dict, base: dict = UNIT) -> dict:
    return sglang_args.build_env(config.from_dict({"name": "a", "model": "m", **settings}), dict(base))


def test_every_cache_is_in_the_unit_cache_directory_and_none_in_tmp():
    env = child_env({"cacheDir": "/var/cache/hf"})  # the model cache may be shared: not the JIT's
    found = jit_caches.caches(env)
    assert set(found) == {"tvm-ffi", "flashinfer", "cute-dsl", "triton", "cuda", "torchinductor"}
    for name, path in found.items():
        assert path.is_relative_to("/var/cache/dflash-a/jit"), (name, path)
    assert env["HF_HOME"] == "/var/cache/hf"


def test_without_the_variables_two_caches_would_land_in_private_tmp():
    """What this module is for: CuTe-DSL's and inductor's defaults are in /tmp (PrivateTmp=true)."""
    found = jit_caches.caches({"HOME": "/var/cache/dflash-a", "USER": "dflash-a"})
    assert found["cute-dsl"] == Path("/tmp/dflash-a/cutlass_python_cache")
    assert found["torchinductor"] == Path("/tmp/torchinductor_dflash-a")


def test_a_value_the_instance_sets_wins():
    env = child_env({"environment": {"TRITON_CACHE_DIR": "/srv/triton"}})
    assert env["TRITON_CACHE_DIR"] == "/srv/triton"
    assert env["TVM_FFI_CACHE_DIR"] == "/var/cache/dflash-a/jit/tvm-ffi"
    inherited = child_env({}, {**UNIT, "CUDA_CACHE_PATH": "/srv/nv"})
    assert inherited["CUDA_CACHE_PATH"] == "/srv/nv"


def test_outside_systemd_the_caches_follow_xdg_or_home():
    assert child_env({}, {"HOME": "/home/u"})["TVM_FFI_CACHE_DIR"] == "/home/u/.cache/dflashctl/jit/tvm-ffi"
    assert child_env({}, {"HOME": "/home/u", "XDG_CACHE_HOME": "/c"})["CUTE_DSL_CACHE_DIR"] == \
        "/c/dflashctl/jit/cute-dsl"
    assert not set(jit_caches.CACHES) & set(child_env({}, {}))  # nothing named: the tools decide


def test_a_cache_in_the_store_is_refused_with_the_fix():
    with pytest.raises(DflashError) as e:
        child_env({"environment": {"TVM_FFI_CACHE_DIR": "/nix/store/abc-kernels"}})
    assert e.value.exit_code == CONFIG
    assert "DFLASH_PREBUILT_KERNELS" in e.value.fix and "read-only" in e.value.what
