"""What the service depends on of SGLang 0.5.11's behaviour, read from its source (server_args.py,
model_executor/model_runner.py). A new SGLang pin re-reads each of these (README.md, "Changing a
pin"); host/sglang_0_5_11.py and smoke/sglang_0_5_11.py hold the rest.

The flag mapping is not here: service/sglang_args.py maps settings to SGLang's flags.
"""

# SGLang checks port + 10000 (its gRPC port, unless SGLANG_GRPC_PORT is set) <= 65535 at start.
GRPC_PORT_OFFSET = 10000
GRPC_PORT_ENV = "SGLANG_GRPC_PORT"
MAX_PORT = 65535 - GRPC_PORT_OFFSET


def piecewise_graph_tokens(max_tokens: int) -> int:
    """How many piecewise CUDA graphs SGLang captures (ServerArgs._generate_piecewise_cuda_graph_tokens)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return sum(1 for s in sizes if s <= max_tokens)


def default_mem_fraction(total_mib: int, tp_size: int = 1, speculative: str | None = None,
                         cuda_graph_max_bs: int | None = None, piecewise: bool = True) -> float:
    """mem_fraction_static as SGLang computes it when it is not given
    (ServerArgs._handle_gpu_memory_settings), for the plain case: no DP attention, no MLA, not
    multimodal, pipeline parallel 1, default chunked prefill. It reserves MiB for activations and
    CUDA graphs and claims the rest: round((total - reserved) / total, 3).
    """
    if total_mib < 20 * 1024:
        chunk, bs = 2048, 8
    elif total_mib < 35 * 1024:
        chunk, bs = 2048, (24 if tp_size < 4 else 80)
    elif total_mib < 60 * 1024:
        chunk, bs = 4096, (32 if tp_size < 4 else 160)
    elif total_mib < 160 * 1024:
        chunk, bs = 8192, (256 if tp_size < 4 else 512)
    else:
        chunk, bs = 16384, 512
    bs = cuda_graph_max_bs or bs
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp_size / 8 * 1024
    if piecewise:
        reserved += piecewise_graph_tokens(chunk) * 8
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative and speculative.upper() not in ("NGRAM",):
        reserved += 6 * 1024 if speculative.upper() == "STANDALONE" else 4 * 1024
    return round((total_mib - reserved) / total_mib, 3)


def pool_mib(free_mib: int, total_mib: int, fraction: float) -> int:
    """What SGLang gives weights + KV cache: the memory free at its start minus (1 - f) x the GPU's
    total; at or below zero it stops with "Not enough memory" after loading the weights (on the
    H200 a second instance with the first one's memFractionStatic on the same GPU got less than
    nothing and stopped so; 0.2 then 0.5 both ran)."""
    return int(free_mib - (1 - fraction) * total_mib)


# Readiness (service/server.py). /health_generate (and /health, the same handler, which the router
# polls) answers 503 at once while the server starts; once it is up it sends itself a one-token
# request and sleeps a whole second before looking for the answer (srt/entrypoints/http_server.py),
# so every 200 costs at least 1 s. The same two facts sooner: the line below, logged at INFO once
# SGLang's own warm-up request returned and its status became Up (_wait_and_warmup), then one greedy
# token of ours through /generate, which answers as soon as it is decoded. `log_metrics` false
# (GenerateReqInput) keeps that request out of SGLang's metrics, as its own health request is.
# The Nix stack's sglang fix-up promptReadiness (overlays/fixups/sglang.nix) takes both seconds out
# of the locked wheel (the handler's and the warm-up's); a pip stack keeps them, and serve waits the
# same way on either.
WARMED_UP_LINE = "The server is fired up and ready to roll!"
READY_DECODE = {"input_ids": list(range(100, 116)),  # ids below 1000: in every vocabulary
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}, "log_metrics": False}
