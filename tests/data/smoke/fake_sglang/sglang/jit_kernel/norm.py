from sglang.jit_kernel._build import load_jit


def can_use_fused_inplace_qknorm(head_dim, dtype):
    load_jit("qknorm", head_dim, dtype)
    return True
