from sglang.jit_kernel._build import load_jit


def _jit_fused_rope_module(is_neox, rope_dim, dtype):
    return load_jit("fused_rope", is_neox, rope_dim, dtype)
