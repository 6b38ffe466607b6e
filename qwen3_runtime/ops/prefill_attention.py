"""Causal attention for prompts packed back to back (prefill, no prefix cache).

Runs eagerly (never inside a CUDA graph), so a per-sequence loop over PyTorch's
fused SDPA is enough: the prompt's matmuls dominate, not the loop.
"""

import torch
import torch.nn.functional as F


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: list[int],
    scale: float,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D]; sequence i is rows cu_seqlens[i]:cu_seqlens[i+1]. Returns [T, H, D]."""
    out = torch.empty_like(q)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if start == end:
            continue
        # SDPA wants [heads, tokens, D].
        seq_q, seq_k, seq_v = (t[start:end].transpose(0, 1) for t in (q, k, v))
        seq_out = F.scaled_dot_product_attention(seq_q, seq_k, seq_v, is_causal=True, scale=scale, enable_gqa=True)
        out[start:end] = seq_out.transpose(0, 1)
    return out
