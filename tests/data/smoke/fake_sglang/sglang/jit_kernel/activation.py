from sglang.jit_kernel._build import load_jit


def _jit_activation_module(dtype):
    return load_jit("activation", dtype)
