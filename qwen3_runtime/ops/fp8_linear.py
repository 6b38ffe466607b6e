"""Projections with block-FP8 weights, the format of Qwen's (and DeepSeek's) FP8 checkpoints: w float8_e4m3fn [N, K]
and scale fp32 [ceil(N / 128), ceil(K / 128)], W ~= w * scale[n // 128, k // 128] (the last block partial where N or
K is not a multiple of 128); experts stack both, [E, N, K] and [E, ceil(N / 128), ceil(K / 128)].

- Decode sizes (the rows ops/linear.py's skinny kernel takes for bf16: up to SKINNY_MAX_ROWS, FUSED_MAX_ROWS for
  gate/up and the split-K partials): weight-only. The same skinny kernel streams the FP8 weight tiles (half the
  bytes), converts them to x's dtype in registers and scales each K-tile's product by its weight rows' block scales;
  the same epilogues (silu * up, fp32 partials for the next norm), PDL and L2 prefetch.
- More rows: W8A8 on the FP8 tensor cores. x is quantized per token and 128-column group
  (`quantize_activation_groups`, one pass), then a block-scaled GEMM (ops/fp8_linear_kernels.py) adds each 128-wide
  K-tile's FP8 product times its row and column scales in fp32; gate/up keeps its silu * up epilogue.
- invariant (engine.batch_invariant): W8A8 at every row count with one tile shape. Its activation scales are per
  token, so a row's result does not depend on the batch.
- The CPU dequantizes and runs the bf16 op (correct, not fast); so does a GPU without FP8 tensor cores at sizes past
  the skinny kernel's.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton

from qwen3_runtime.ops import TRITON_INTERPRET, pdl_launch, use_triton
from qwen3_runtime.ops.fp8_linear_kernels import quantize_groups_kernel, w8a8_kernel
from qwen3_runtime.ops.linear import (
    FUSED_MAX_ROWS,
    MLP_EARLY_ROWS,
    SCALE_BLOCK,
    SKINNY_MAX_ROWS,
    gated_linear,
    linear,
    linear_partials,
    skinny_gated_linear,
    skinny_linear,
    skinny_partials,
)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# Weight-only (skinny) up to these rows, W8A8 above: bf16's limits until the benchmark (scripts/bench_fp8.py) says
# where the FP8 paths cross.
FP8_SKINNY_MAX_ROWS, FP8_FUSED_MAX_ROWS = SKINNY_MAX_ROWS, FUSED_MAX_ROWS
# Rows a program of the activation quantizer takes (each of one 128-column group).
QUANT_BLOCK_T = 16


class W8A8Tiles(NamedTuple):
    """A W8A8 launch's shape: rows, weight rows (gate and up rows together when gated) and K per tile (K divides
    SCALE_BLOCK), row tiles grouped over the column tiles, warps, pipeline stages."""

    block_m: int
    block_n: int
    block_k: int = SCALE_BLOCK
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


# Two warpgroups of 64 rows on large prefills; one on smaller ones, whose 128-row tiles would leave SMs idle.
W8A8_SMALL_TILES = W8A8Tiles(64, 128, num_warps=4, num_stages=4)
W8A8_LARGE_TILES = W8A8Tiles(128, 128, num_warps=8, num_stages=3)
W8A8_SMALL_MAX_ROWS = 512
# engine.batch_invariant: one shape at every row count.
INVARIANT_TILES = W8A8_LARGE_TILES


def quantize_blocks(w: torch.Tensor, block: int = SCALE_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] -> (e4m3 [..., N, K], fp32 scale [..., ceil(N / block), ceil(K / block)]): each block's scale
    amax / 448 (1 for an all-zero block), its values divided by it and rounded to the nearest e4m3 (ties to even).
    Stacked weights are quantized one matrix at a time (a whole layer's experts in fp32 would not fit beside them)."""
    if w.dim() > 2:
        parts = [quantize_blocks(part, block) for part in w.reshape(-1, *w.shape[-2:])]
        q, scale = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
        return q.view(w.shape), scale.view(*w.shape[:-2], *scale.shape[-2:])
    n, k = w.shape
    nb, kb = triton.cdiv(n, block), triton.cdiv(k, block)
    blocks = F.pad(w.float(), (0, kb * block - k, 0, nb * block - n)).view(nb, block, kb, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, 1.0)
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * block, kb * block)[:n, :k]
    return q.to(FP8).contiguous(), scale


def dequantize_blocks(w: torch.Tensor, scale: torch.Tensor, block: int = SCALE_BLOCK) -> torch.Tensor:
    """w [..., N, K] (e4m3) times its block scales -> fp32 [..., N, K]."""
    n, k = w.shape[-2:]
    full = scale.float().repeat_interleave(block, -2)[..., :n, :].repeat_interleave(block, -1)[..., :k]
    return w.float() * full


def quantize_activation_groups(x: torch.Tensor, group: int = SCALE_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (e4m3 [T, K], fp32 scale [T, ceil(K / group)]): per token and group of columns, scale amax / 448
    (1 for an all-zero group) and x / scale rounded to the nearest e4m3, as `quantize_blocks` does per block."""
    if not use_triton(x):
        return quantize_activation_groups_reference(x, group)
    tokens, k = x.shape
    assert x.stride(1) == 1
    q = torch.empty(tokens, k, dtype=FP8, device=x.device)
    scale = torch.empty(tokens, triton.cdiv(k, group), dtype=torch.float32, device=x.device)
    if tokens:
        quantize_groups_kernel[(triton.cdiv(tokens, QUANT_BLOCK_T), scale.shape[1])](
            x, q, scale, tokens, k, x.stride(0), q.stride(0), scale.stride(0),
            BLOCK_T=QUANT_BLOCK_T, GROUP=group, INTERPRET=TRITON_INTERPRET, num_warps=4, **pdl_launch(x),
        )  # fmt: skip
    return q, scale


def quantize_activation_groups_reference(
    x: torch.Tensor, group: int = SCALE_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, k = x.shape
    groups = triton.cdiv(k, group)
    parts = F.pad(x.float(), (0, groups * group - k)).view(tokens, groups, group)
    amax = parts.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, 1.0)
    q = (parts / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).view(tokens, groups * group)[:, :k]
    return q.to(FP8).contiguous(), scale


def fp8_linear_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x @ W^T of the dequantized weight, in fp32, rounded once to x's dtype."""
    return (x.float() @ dequantize_blocks(w, scale).t()).to(x.dtype)


def fp8_linear(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, dependents_early: bool = False, invariant: bool = False
) -> torch.Tensor:
    """x [T, K] @ W^T -> [T, N] in x's dtype, W the block-FP8 weight (w, scale). dependents_early: as ops.linear."""
    if not use_triton(x):
        return linear(x, _dequantized(w, scale, x.dtype))
    if not invariant and 0 < x.shape[0] <= FP8_SKINNY_MAX_ROWS:
        return skinny_linear(x, w, dependents_early, scale=scale)
    return _past_skinny(x, w, scale, invariant)


def fp8_gated_linear(
    x: torch.Tensor, w13: torch.Tensor, scale13: torch.Tensor, dependents_early: bool = False, invariant: bool = False
) -> torch.Tensor:
    """silu(x @ W_gate^T) * (x @ W_up^T) -> [T, I] for the fused block-FP8 weight w13 [2I, K] (gate rows, then up
    rows) and its scales [2I / 128, ceil(K / 128)] (gate's blocks, then up's): I must be a multiple of 128, so that no
    scale block holds gate and up rows."""
    assert w13.shape[0] % (2 * SCALE_BLOCK) == 0, "gate/up: the intermediate size must be a multiple of 128"
    if not use_triton(x):
        return gated_linear(x, _dequantized(w13, scale13, x.dtype))
    if not invariant and 0 < x.shape[0] <= FP8_FUSED_MAX_ROWS:
        return skinny_gated_linear(x, w13, dependents_early, scale=scale13)
    return _past_skinny(x, w13, scale13, invariant, gated=True)


def fp8_linear_partials(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, launched_early: bool = False, invariant: bool = False
) -> torch.Tensor:
    """x @ W^T as [S, T, N] partial sums for the next norm to add, as ops.linear.linear_partials: fp32 slices of K
    from the skinny kernel, [1, T, N] in x's dtype past it."""
    if not use_triton(x):
        return linear_partials(x, _dequantized(w, scale, x.dtype))
    if not invariant and 0 < x.shape[0] <= FP8_FUSED_MAX_ROWS:
        return skinny_partials(x, w, launched_early=launched_early, scale=scale)
    return _past_skinny(x, w, scale, invariant)[None]


def fp8_mlp_partials(
    x: torch.Tensor,
    w13: torch.Tensor,
    s13: torch.Tensor,
    w2: torch.Tensor,
    s2: torch.Tensor,
    invariant: bool = False,
) -> torch.Tensor:
    """down_proj(silu(gate) * up) as [S, T, hidden] partial sums, as ops.linear.mlp_partials (up to MLP_EARLY_ROWS
    rows down_proj launches as gate/up starts and requests its first weight tiles early)."""
    early = use_triton(x) and not invariant and 0 < x.shape[0] <= min(MLP_EARLY_ROWS, FP8_SKINNY_MAX_ROWS)
    gated = fp8_gated_linear(x, w13, s13, dependents_early=early, invariant=invariant)
    return fp8_linear_partials(gated, w2, s2, launched_early=early, invariant=invariant)


def w8a8_linear(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, gated: bool = False, tiles: W8A8Tiles | None = None
) -> torch.Tensor:
    """The W8A8 path at any row count: x quantized per token and group, then the block-scaled GEMM -> [T, N] (gated:
    silu(gate) * up, [T, N / 2]) in x's dtype. `tiles`: by default by the rows (scripts/bench_fp8.py sweeps them)."""
    q, q_scale = quantize_activation_groups(x)
    return w8a8_matmul(q, q_scale, w, scale, x.dtype, gated, tiles)


def w8a8_matmul(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    gated: bool = False,
    tiles: W8A8Tiles | None = None,
) -> torch.Tensor:
    """(a * a_scale) @ (w * w_scale)^T for e4m3 a [M, K] with per-row-and-group scales [M, ceil(K / 128)] and the
    block-FP8 weight w [N, K] -> [M, N] (gated: silu(gate) * up, [M, N / 2]) in out_dtype."""
    rows, k = a.shape
    n = w.shape[0] // 2 if gated else w.shape[0]
    tiles = tiles or (W8A8_SMALL_TILES if rows <= W8A8_SMALL_MAX_ROWS else W8A8_LARGE_TILES)
    assert a.dtype == w.dtype == FP8 and w.shape[1] == k and SCALE_BLOCK % tiles.block_k == 0
    assert a.stride(1) == w.stride(1) == a_scale.stride(1) == w_scale.stride(1) == 1
    assert a_scale.shape == (rows, triton.cdiv(k, SCALE_BLOCK)) and a_scale.dtype == w_scale.dtype == torch.float32
    assert w_scale.shape == (triton.cdiv(w.shape[0], SCALE_BLOCK), triton.cdiv(k, SCALE_BLOCK))
    assert not gated or n % SCALE_BLOCK == 0
    out = torch.empty(rows, n, dtype=out_dtype, device=a.device)
    if rows:
        tile_cols = tiles.block_n // 2 if gated else tiles.block_n
        w8a8_kernel[(triton.cdiv(rows, tiles.block_m) * triton.cdiv(n, tile_cols),)](
            a, a_scale, w, w_scale, out, rows, n, k,
            a.stride(0), a_scale.stride(0), w.stride(0), w_scale.stride(0), out.stride(0),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
            SCALE_BLOCK=SCALE_BLOCK, GATED=gated, EVEN_K=k % tiles.block_k == 0, UPCAST=not a.is_cuda,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_launch(a),
        )  # fmt: skip
    return out


def _past_skinny(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, invariant: bool, gated: bool = False
) -> torch.Tensor:
    """The rows past the skinny kernel's (or every row, invariant): W8A8 where the GPU has FP8 tensor cores, else the
    dequantized weight through the bf16 path."""
    if TRITON_INTERPRET or fp8_tensor_cores(x.device):
        return w8a8_linear(x, w, scale, gated, INVARIANT_TILES if invariant else None)
    weight = _dequantized(w, scale, x.dtype)
    return gated_linear(x, weight, invariant=invariant) if gated else linear(x, weight, invariant=invariant)


def _dequantized(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_blocks(w, scale).to(dtype)


@functools.lru_cache
def fp8_tensor_cores(device: torch.device) -> bool:
    """FP8 tensor cores (Ada, Hopper and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
