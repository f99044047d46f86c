"""What host/ depends on of SGLang 0.5.11's behaviour, read from its source. A new SGLang pin
re-reads each of these (README.md, "Changing a pin"); service/sglang_0_5_11.py and
smoke/sglang_0_5_11.py hold what the service and the smoke depend on.

Not here, because they are data or rules of their own: the model classes SGLang registers
(data/sglang-models.json, written by sglang_models.py), the target/drafter rules
(model_pair.py, each naming the SGLang behaviour it stands for), and the flag mapping
(service/sglang_args.py).
"""

# What SGLang imports from each grammar backend at start-up (srt/constrained/*_backend.py). It lives
# in probe_child.py, which runs alone in the stack's interpreter; this is its name for everyone else.
from dflashctl.host.probe_child import GRAMMAR_NAMES as GRAMMAR_IMPORTS

GRAMMAR_BACKENDS = tuple(GRAMMAR_IMPORTS)  # those with a library to check: xgrammar, llguidance, outlines
GRAMMAR_BACKEND_CHOICES = (*GRAMMAR_BACKENDS, "none")  # --grammar-backend's choices
DEFAULT_GRAMMAR_BACKEND = "xgrammar"


def jit_calls(config: dict) -> list[list]:
    """SGLang's JIT module loaders that a Qwen3-style model calls, with its shapes
    (jit_kernel/norm.py, rope.py, kvcache.py, activation.py, clamp_position.py,
    resolve_future_token_ids.py: on the H200's fresh start the last one was built just before the
    first decode, ~7 s on the critical path, when the prewarm lacked it)."""
    heads = config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or (config.get("hidden_size", 0) // heads)
    kv_heads = config.get("num_key_value_heads") or heads
    dtype = "torch." + {"float16": "float16", "half": "float16", "float32": "float32"}.get(
        str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), "bfloat16")
    row_bytes = kv_heads * head_dim * (4 if dtype == "torch.float32" else 2)
    return [
        ["sglang.jit_kernel.norm", "can_use_fused_inplace_qknorm", [head_dim, dtype]],
        ["sglang.jit_kernel.rope", "_jit_fused_rope_module", [True, head_dim, dtype]],
        ["sglang.jit_kernel.kvcache", "can_use_store_cache", [row_bytes]],
        ["sglang.jit_kernel.activation", "_jit_activation_module", [dtype]],
        ["sglang.jit_kernel.clamp_position", "_jit_clamp_position_module", ["torch.int64"]],
        ["sglang.jit_kernel.clamp_position", "_jit_clamp_position_module", ["torch.int32"]],
        ["sglang.jit_kernel.resolve_future_token_ids", "_jit_resolve_future_token_ids_module", ["torch.int64"]],
    ]


# SGLang's kernels in the smoke's Triton recording whose specialisation is chosen from the GPU, not
# from the model: another arch's recording says nothing about them (host/triton_kernels.carry).
# get_num_kv_splits_triton is not here: it takes the SM count as an i32, specialised only when it
# is 1 or a multiple of 16 (132 on the H200, 148 on a B200, 188 on an RTX PRO 6000: none is).
TRITON_GPU_BOUND = {
    ("sglang.srt.layers.attention.triton_ops.extend_attention", "_fwd_kernel"):
        "BLOCK_M and BLOCK_N are chosen per compute capability (_get_block_sizes_for_extend_attention: "
        "128x64 on sm90, 64x64 on sm100, 64x128 on sm120 for head_dim <= 128)",
    ("sglang.srt.constrained.triton_ops.bitmask_ops", "apply_token_bitmask_inplace_kernel"):
        "NUM_SMS is a constexpr: the GPU's SM count (132 on the H200)",
}


# The third-party libraries SGLang's scheduler and detokenizer import, which the fast start's
# template imports once beside the server (host/faststart.py; the file says how it was read).
FASTSTART_PRELOAD = "sglang-0.5.11-preload.json"
