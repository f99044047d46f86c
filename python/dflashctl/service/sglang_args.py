"""The one mapping from instance settings to SGLang's command line and environment.

Nothing else (not the NixOS module, not the unit renderer) knows SGLang's flag names.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING

from dflashctl.host import jit_caches

if TYPE_CHECKING:  # config imports MAPPED_FLAGS from here; the settings type is only annotated
    from dflashctl.service.config import InstanceConfig

# Flags this module sets, with the option that owns each (extraArgs may not repeat them).
MAPPED_FLAGS = {
    "--model-path": "model",
    "--revision": "modelRevision",
    "--speculative-draft-model-revision": "draftModelRevision",
    "--host": "host",
    "--port": "port",
    "--tp-size": "tpSize",
    "--tp": "tpSize",
    "--grammar-backend": "grammarBackend",
    "--constrained-json-disable-any-whitespace": "constrainedJsonDisableAnyWhitespace",
    "--speculative-algorithm": "speculative.algorithm",
    "--speculative-draft-model-path": "draftModel",
    "--speculative-num-draft-tokens": "speculative.numDraftTokens",
    "--speculative-dflash-block-size": "speculative.numDraftTokens",
    "--speculative-ddtree-budget": "speculative.ddtreeBudget",
    "--speculative-draft-attention-backend": "speculative.draftAttentionBackend",
    "--attention-backend": "attentionBackend",
    "--mem-fraction-static": "memFractionStatic",
    "--context-length": "contextLength",
    "--served-model-name": "servedModelName",
    "--api-key": "apiKeyFile",
    "--enable-metrics": "enableMetrics",
    "--load-format": "loadFormat",
    "--speculative-draft-load-format": "draftLoadFormat",
    "--skip-tokenizer-init": "skipTokenizerInit",
    "--cuda-graph-max-bs": "cudaGraphMaxBs",
    "--sampling-backend": "samplingBackend",
    "--disable-cuda-graph": "disableCudaGraph",
}

API_KEY_PLACEHOLDER = "<apiKeyFile>"


def build_argv(cfg: InstanceConfig, python: str = sys.executable, api_key: str | None = None) -> list[str]:
    """[python, "-m", "sglang.launch_server", ...] for this instance.

    `api_key` is the key's text (read by serve from the systemd credential); without it a
    placeholder stands in, so the argv can be shown without revealing the key.
    """
    spec = cfg.speculative
    argv = [python, "-m", "sglang.launch_server",
            "--model-path", cfg.model,
            "--host", cfg.host,
            "--port", str(cfg.port),
            "--tp-size", str(cfg.tp_size),
            "--grammar-backend", cfg.grammar_backend]

    def opt(flag: str, value) -> None:
        if value is not None:
            argv.extend([flag, str(value)])

    def switch(flag: str, on: bool) -> None:
        if on:
            argv.append(flag)

    opt("--speculative-algorithm", spec.algorithm)
    opt("--revision", cfg.model_revision)
    opt("--speculative-draft-model-path", cfg.draft_model)
    opt("--speculative-draft-model-revision", cfg.draft_model_revision)
    opt("--speculative-num-draft-tokens", spec.num_draft_tokens)
    opt("--speculative-ddtree-budget", spec.ddtree_budget)
    opt("--speculative-draft-attention-backend", spec.draft_attention_backend)
    opt("--speculative-draft-load-format", cfg.draft_load_format)
    opt("--attention-backend", cfg.attention_backend)
    opt("--mem-fraction-static", cfg.mem_fraction_static)
    opt("--context-length", cfg.context_length)
    opt("--served-model-name", cfg.served_model_name)
    opt("--load-format", cfg.load_format)
    opt("--sampling-backend", cfg.sampling_backend)
    opt("--cuda-graph-max-bs", cfg.cuda_graph_max_bs)
    switch("--constrained-json-disable-any-whitespace", cfg.constrained_json_disable_any_whitespace)
    switch("--skip-tokenizer-init", cfg.skip_tokenizer_init)
    switch("--disable-cuda-graph", cfg.disable_cuda_graph)
    switch("--enable-metrics", cfg.enable_metrics)
    if cfg.api_key_file is not None:
        argv.extend(["--api-key", api_key if api_key is not None else API_KEY_PLACEHOLDER])
    argv.extend(cfg.extra_args)
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
