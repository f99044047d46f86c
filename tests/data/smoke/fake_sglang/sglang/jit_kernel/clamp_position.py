from sglang.jit_kernel._build import load_jit


def _jit_clamp_position_module(dtype):
    return load_jit("clamp_position", dtype)
