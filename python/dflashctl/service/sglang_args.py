"""The one mapping from instance settings to SGLang's command line and environment.

Which flag each setting becomes is data (data/settings.json, "sglang"); this module applies it.
Nothing else (not the NixOS module, not the unit renderer) turns settings into SGLang's argv.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING

from dflashctl.host import jit_caches
from dflashctl.service import settings_schema

if TYPE_CHECKING:  # the settings type is only annotated
    from dflashctl.service.config import InstanceConfig

# Flags the settings set, with the setting that owns each (extraArgs may not repeat them); the
# flag names and how each value maps are data/settings.json's "sglang".
MAPPED_FLAGS = settings_schema.load().mapped_flags()

API_KEY_PLACEHOLDER = "<apiKeyFile>"


def _value(cfg, setting: settings_schema.Setting):
    holder = cfg if setting.group is None else getattr(cfg, setting.group)
    return getattr(holder, setting.attr)


def _words(kind: str, flag: str | None, value, api_key: str | None) -> list[str]:
    """The argv words of one setting's value, by its schema's `map`."""
    if kind == "append":
        return list(value)
    if value is None or value is False:
        return []
    if kind == "switch":
        return [flag]
    if kind == "credential":  # the file's text, read by serve from the systemd credential
        return [flag, api_key if api_key is not None else API_KEY_PLACEHOLDER]
    return [flag, str(value)]


def build_argv(cfg: InstanceConfig, python: str = sys.executable, api_key: str | None = None,
               schema: settings_schema.Schema | None = None) -> list[str]:
    """[python, "-m", "sglang.launch_server", ...] for this instance, in the schema's order.

    `api_key` is the key's text (read by serve from the systemd credential); without it a
    placeholder stands in, so the argv can be shown without revealing the key.
    """
    argv = [python, "-m", "sglang.launch_server"]
    for setting in (schema or settings_schema.load()).settings:
        sg = setting.sglang
        if sg is not None:
            argv += _words(sg["map"], sg.get("flag"), _value(cfg, setting), api_key)
    return argv


def build_env(cfg: InstanceConfig, base_env: dict[str, str] | None = None,
              hf_token: str | None = None) -> dict[str, str]:
    """The child's environment: base_env + GPUs + model cache + the instance's `environment`, then
    every JIT cache under the instance's cache directory (host/jit_caches.py; values set win).

    `hf_token` (read by serve from the systemd credential) becomes HF_TOKEN and nothing else:
    never argv, never a file the child or a log can show.
    """
    env = dict(os.environ if base_env is None else base_env)
    env.pop("HF_TOKEN", None)  # only the instance's own credential, never an inherited one
    if cfg.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in cfg.gpus)
    cache = cfg.cache_dir or env.get("CACHE_DIRECTORY", "").split(":")[0] or None
    if cache:
        env["HF_HOME"] = cache
    if cfg.offline:  # the weights were fetched ahead (`dflashctl models fetch`); never reach the hub
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
    # Logs reach the journal line by line, not in 8 KiB blocks.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(cfg.environment)
    env = jit_caches.provide(env, jit_caches.root_for(env, cfg.cache_dir))
    if hf_token is not None:
        env["HF_TOKEN"] = hf_token
    return env


def cache_env(cfg: InstanceConfig, cache_dir: str | None = None) -> dict[str, str]:
    """The environment SGLang's hub client will see for this instance under its unit (HF_HOME), for
    commands that run outside it (`models fetch`, `validate --models`)."""
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "XDG_CACHE_HOME", "HF_HOME")}
    # The unit's CacheDirectory=%N is /var/cache/dflash-<name>; cacheDir replaces it.
    home = cache_dir or cfg.cache_dir or f"/var/cache/dflash-{cfg.name}"
    return build_env(dataclasses.replace(cfg, cache_dir=home), env)
