"""The lossless tests' smoke load (the H200's: 8 prompts x 256 tokens, no grammar phase) and the
arguments naming the real pair (Qwen3-8B with its DFlash drafter)."""

LOAD = ["--requests", "8", "--sequential-requests", "4", "--max-new-tokens", "256", "--input-len", "32",
        "--seed", "0", "--no-grammar"]


def real_pair_args():
    return ["--model", "Qwen/Qwen3-8B", "--draft-model", "z-lab/Qwen3-8B-DFlash-b16"]
