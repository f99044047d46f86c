from sglang.jit_kernel._build import load_jit


def can_use_store_cache(row_bytes):
    load_jit("kvcache", row_bytes)
    return True
