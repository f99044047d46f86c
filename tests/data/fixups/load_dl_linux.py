# Excerpt of cuda/pathfinder/_dynamic_libs/load_dl_linux.py, cuda_pathfinder-1.5.4
# (Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES; Apache-2.0): what the fix-up patches.
def _candidate_sonames(desc: LibDescriptor) -> list[str]:
    # Reverse tabulated names to achieve new -> old search order.
    candidates = list(reversed(desc.linux_sonames))
    candidates.append(f"lib{desc.name}.so")
    return candidates

