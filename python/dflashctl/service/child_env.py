"""The SGLang child's environment, built one way for `dflashctl serve` and `dflashctl smoke`.

settings -> sglang_args.build_env (GPUs, model cache, the instance's `environment`, JIT caches,
the hub token) -> cuda_home (the stack's nvcc as CUDA_HOME, its bin/ on PATH) -> kernels (the
prebuilt-kernel hook, when $DFLASH_PREBUILT_KERNELS is set) -> faststart (SGLang's children forked
from a preloaded template, `fastStart`; the same start-up hook) -> driver (the host's driver libraries
first on LD_LIBRARY_PATH, driverLibraryDir honoured; a mismatch raises PREFLIGHT_DRIVER). Smoke
starts its servers through this same function, so what it measures is what serve would start.
"""

from dataclasses import dataclass

from dflashctl.host import cuda_home, driver, faststart, kernels
from dflashctl.service import config, sglang_args


@dataclass(frozen=True)
class ChildEnv:
    env: dict[str, str]
    driver: driver.Driver | None  # what discovery found; None: the loader's own search decides

    def driver_line(self) -> str:
        return driver_line(self.driver)


def driver_line(found: driver.Driver | None) -> str:
    """What driver discovery found, as serve and smoke tell the user before SGLang starts."""
    return (f"driver: {found.describe()}" if found else
            "driver: no NVIDIA driver libraries found by discovery; the loader's own search decides")


def child_env(cfg: config.InstanceConfig, python: str, base_env: dict[str, str] | None = None,
              hf_token: str | None = None) -> ChildEnv:
    """The environment SGLang runs in for these settings (`base_env`: the parent's, default
    os.environ); raises DflashError where the prebuilt kernels or the driver do not fit."""
    env = cuda_home.provide(sglang_args.build_env(cfg, base_env, hf_token), python)
    env = kernels.provide(env)
    env = faststart.provide(env, faststart.wanted(cfg.fast_start, cfg.tp_size))
    env, found = driver.provide(env, cfg.driver_library_dir)
    return ChildEnv(env, found)


def settings_env(cfg: config.InstanceConfig) -> dict[str, str]:
    """What the settings alone add to SGLang's environment, fast start included: `serve --dry-run`
    shows it without reading this host (no CUDA home, prebuilt kernels or driver discovery)."""
    return faststart.provide(sglang_args.build_env(cfg, {}), faststart.wanted(cfg.fast_start, cfg.tp_size))
