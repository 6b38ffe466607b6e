"""Projections by block-FP8 weights (Qwen's FP8 checkpoints: e4m3 weights, one fp32 scale per 128 x 128 block, W ~=
weight x scale): PyTorch references only, which dequantize the weight to x's dtype and call ops/linear.py. Correct
anywhere (the CPU path), not fast: the FP8 kernels replace these functions under the same names and signatures."""

from __future__ import annotations

import torch

from qwen3_runtime.ops import cdiv
from qwen3_runtime.ops.linear import gated_linear, linear, linear_partials, mlp_partials

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
BLOCK = 128


def quantize_blocks(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (any float) -> (e4m3 [N, K], fp32 scale [ceil(N / block), ceil(K / block)]): each block's largest
    magnitude maps to e4m3's largest value (partial last blocks count their own elements only)."""
    n, k = w.shape
    rows, cols = cdiv(n, block), cdiv(k, block)
    padded = w.new_zeros(rows * block, cols * block, dtype=torch.float32)
    padded[:n, :k] = w
    blocks = padded.view(rows, block, cols, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    quantized = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return quantized.view(rows * block, cols * block)[:n, :k].contiguous(), scale


def dequantize_blocks(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 w [N, K] times its block scales [ceil(N / 128), ceil(K / 128)] -> fp32 [N, K]."""
    n, k = w.shape
    return w.float() * scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


def fp8_linear(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, dependents_early: bool = False, invariant: bool = False
) -> torch.Tensor:
    """x [T, K] @ W^T -> [T, N] in x's dtype (ops.linear.linear's contract)."""
    return linear(x, _weight(w, scale, x), dependents_early=dependents_early, invariant=invariant)


def fp8_gated_linear(
    x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, dependents_early: bool = False, invariant: bool = False
) -> torch.Tensor:
    """silu(x @ W_gate^T) * (x @ W_up^T) for the fused gate/up weight (ops.linear.gated_linear's contract)."""
    return gated_linear(x, _weight(w13, s13, x), dependents_early=dependents_early, invariant=invariant)


def fp8_linear_partials(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, launched_early: bool = False, invariant: bool = False
) -> torch.Tensor:
    """x @ W^T as [S, T, N] partial sums for the next norm to add (ops.linear.linear_partials' contract)."""
    return linear_partials(x, _weight(w, scale, x), launched_early=launched_early, invariant=invariant)


def fp8_mlp_partials(
    x: torch.Tensor,
    w13: torch.Tensor,
    s13: torch.Tensor,
    w2: torch.Tensor,
    s2: torch.Tensor,
    invariant: bool = False,
) -> torch.Tensor:
    """down(silu(gate) * up) as [S, T, hidden] partial sums (ops.linear.mlp_partials' contract)."""
    return mlp_partials(x, _weight(w13, s13, x), _weight(w2, s2, x), invariant)


def _weight(w: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return dequantize_blocks(w, scale).to(x.dtype)
