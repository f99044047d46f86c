from sglang.jit_kernel._build import load_jit


def _jit_resolve_future_token_ids_module(dtype):
    return load_jit("resolve_future_token_ids", dtype)
