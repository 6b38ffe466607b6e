"""Projections of a few rows (a decode step, a small prefill step) as a Triton skinny GEMM: y = x @ W^T with
W [N, K] row-major.

A step of a few rows only streams weights, so what matters is keeping enough loads in flight on every
SM; at a few rows this kernel comes closer to the copy bandwidth than cuBLAS (scripts/bench_kernels.py).
cuBLAS is worst on the two with few output columns (o_proj and down_proj, N = hidden size), where too
few tiles cover the GPU. There each program takes one of `splits` slices of K and writes an fp32
partial sum; the partials are added by the next kernel, the residual add + RMSNorm (`add_rms_norm`),
so the split costs no extra launch and no atomics.
More rows go to cuBLAS. Steps of few rows replay CUDA graphs, decode and prefill alike, which hide the
Triton launches' host time (more than a cuBLAS call's). With `invariant` (engine.batch_invariant) every
product goes to ops/invariant_linear.py instead, whose result for a row does not depend on the batch.
The same kernel takes block-FP8 weights (ops/fp8_linear.py): each weight tile converted in registers to x's dtype
and its product scaled by its rows' block scales.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import num_sms, pdl_launch, use_triton
from qwen3_runtime.ops.invariant_linear import invariant_linear
from qwen3_runtime.ops.norms import silu_mul

# Up to SKINNY_MAX_ROWS rows the skinny kernel beats cuBLAS on Qwen3-4B's projections (scripts/bench_kernels.py).
# Up to FUSED_MAX_ROWS it keeps those whose output it hands on fused: o_proj and down_proj (split-K partials the
# next norm adds) and gate/up (the SiLU in its epilogue spares cuBLAS's product a silu_mul).
SKINNY_MAX_ROWS, FUSED_MAX_ROWS = 64, 128
BLOCK_N, BLOCK_K = 64, 128
# Above 32 rows (64-row tiles of x): four stages, and K-tiles of 64 for gate/up, whose epilogue holds both
# halves (tuned over tile shapes, 3-4 stages, at 64 and 128 rows).
WIDE_ROWS, WIDE_STAGES, WIDE_GATED_BLOCK_K = 32, 4, 64
# Weight tiles in flight per SM, over all the programs it holds at once (pipeline stages x programs):
# tuned over 2-8 stages for each Qwen3-4B projection at 1, 8 and 32 rows (triton 3.6).
WEIGHT_STAGES_PER_SM = 9
MAX_STAGES = 6
# A projection whose programs take all of K (qkv, gate/up: each after a norm) requests the first K-tiles
# of its programs' weight rows into L2 before its PDL wait, about this many bytes in all (whole tiles, at
# least one): they arrive while the norm runs and the DRAM idles. More is slower, and so is prefetching
# down_proj's slices this way (after gate/up, which keeps the DRAM busy; but see MLP_EARLY_ROWS).
PREFETCH_BYTES = 4 << 20
# Up to this many rows gate/up lets down_proj launch as it starts, and down_proj's programs, resident as
# gate/up's leave their SMs, request the first K-tile of their weight rows' slices into L2 (~2 MB for
# Qwen3-4B) before their wait, while gate/up's last programs still stream. The two only pay together:
# the early launch alone gains nothing, the prefetch alone is slower. Larger batches gain nothing.
MLP_EARLY_ROWS = 8
# Block-FP8 weights (ops/fp8_linear.py): a fp32 scale per SCALE_BLOCK x SCALE_BLOCK block of the weight.
SCALE_BLOCK = 128


class Tiles(NamedTuple):
    """A skinny launch's shape: weight rows and K per tile, warps, pipeline stages (None: by the programs)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int | None = None


# gate/up past SKINNY_MAX_ROWS: 128 weight rows a tile, so that x is re-read through L2 half as often as with 64.
GATED_WIDE_TILES = Tiles(128, 64, 4, 3)


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_os,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PREFETCH_TILES: tl.constexpr,
    DEPENDENTS_EARLY: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (column tile, split): out[split, :M, tile] = (W[tile, slice] @ x[:, slice]^T)^T.

    The weight tile is the product's left operand: 64 weight rows fill the tensor cores' 64-row
    side, and the few batch rows are the narrow side (padded to 16 or 32), not the other way round.
    GATED: W is a fused gate/up weight [2N, K] and out[:M, tile] = silu(gate) * up, the tile's rows
    alternating a gate column and its up column, so one program holds both.
    SCALE_BLOCK (0: none): W is FP8 with a scale per SCALE_BLOCK x SCALE_BLOCK block (scale_ptr, [N / SB, K / SB]
    rounded up); each K-tile lies in one block (BLOCK_K divides SCALE_BLOCK), so its product with x is scaled by
    each weight row's scale, in fp32, before it is added.
    DEPENDENTS_EARLY: let the next kernel launch as this one starts (mlp_partials), not as it ends."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    if GATED:
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) // 2
        w_rows = cols + (tl.arange(0, BLOCK_N) % 2) * N
    else:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        w_rows = cols
    if PREFETCH_TILES > 0:  # weights are never written, so they may be requested before the wait
        row_starts = w_ptr + tl.where(cols < N, w_rows, 0).to(tl.int64) * stride_wn + split * k_per_split
        tile_bytes = BLOCK_K * w_ptr.dtype.element_ty.primitive_bitwidth // 8  # bf16 or FP8
        tl.inline_asm_elementwise(
            "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
            "=r,l,r",
            [row_starts, tl.full([BLOCK_N], PREFETCH_TILES * tile_bytes, tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    if USE_PDL:  # launched early (ops.pdl_launch): wait for the previous kernel's writes
        if DEPENDENTS_EARLY:
            gdc_launch_dependents()
        gdc_wait()
    offs_k = split * k_per_split + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]  # x^T tile [BLOCK_K, BLOCK_M]
    w_ptrs = w_ptr + w_rows[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    m_mask = offs_m[None, :] < M
    if SCALE_BLOCK:
        s_ptrs = scale_ptr + (w_rows // SCALE_BLOCK) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k in range(0, k_per_split, BLOCK_K):
        if EVEN:  # N and K are whole tiles: unmasked weight loads
            w = tl.load(w_ptrs)
            x_mask = m_mask
        else:
            k_mask = offs_k + k < K
            x_mask = m_mask & k_mask[:, None]
            w = tl.load(w_ptrs, mask=(cols[:, None] < N) & k_mask[None, :], other=0.0)
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if SCALE_BLOCK:  # the K-tile's block column: one scale a weight row
            block = (split * k_per_split + k) // SCALE_BLOCK
            if EVEN:
                s = tl.load(s_ptrs + block)
            else:  # a tile past K (the last slice's) reads the last block's scales for its zeros
                s = tl.load(s_ptrs + tl.minimum(block, (K - 1) // SCALE_BLOCK), mask=cols < N, other=0.0)
            acc += tl.dot(w.to(x.dtype), x, input_precision=DOT_PRECISION) * s[:, None]
        else:
            acc = tl.dot(w, x, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    dtype = out_ptr.dtype.element_ty
    if GATED:  # rounded as the unfused projection and silu_mul would round
        gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_N // 2, 2, BLOCK_M)), (0, 2, 1)))
        gate, up = gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32)
        acc = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    out = out_ptr + split * stride_os + offs_m[None, :] * stride_om + cols[:, None]
    tl.store(out, acc.to(dtype), mask=m_mask & (cols[:, None] < N))
    if USE_PDL and not DEPENDENTS_EARLY:  # last: the next kernel may launch
        gdc_launch_dependents()


def _num_stages(programs: int, device: torch.device) -> int:
    """The deepest software pipeline that still lets every program be resident at once: a second wave
    of a few programs leaves most SMs idle."""
    return max(2, min(MAX_STAGES, WEIGHT_STAGES_PER_SM // triton.cdiv(programs, num_sms(device))))


def _prefetch_tiles(weight: torch.Tensor) -> int:
    """K-tiles per weight row for the pre-wait L2 prefetch: only where the kernel launches early (ops.pdl_launch),
    for bf16 or FP8 rows with the bulk prefetch's 16-byte alignment, whole tiles inside the row."""
    if not (
        weight.dtype in (torch.bfloat16, torch.float8_e4m3fn)
        and pdl_launch(weight)["USE_PDL"]
        and weight.data_ptr() % 16 == 0
        and weight.stride(0) * weight.element_size() % 16 == 0
    ):
        return 0
    tile_bytes = BLOCK_K * weight.element_size()
    return min(max(1, PREFETCH_BYTES // (weight.shape[0] * tile_bytes)), weight.shape[1] // BLOCK_K)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    splits: int,
    gated: bool = False,
    prefetch_tiles: int = 0,
    dependents_early: bool = False,
    tiles: Tiles | None = None,
    scale: torch.Tensor | None = None,
) -> None:
    """`tiles`: the launch's shape (scripts/bench_kernels.py sweeps them); by default the tuned one for the rows.
    `scale`: the FP8 weight's fp32 block scales [ceil(rows / 128), ceil(K / 128)] (ops/fp8_linear.py)."""
    rows = x.shape[0]
    k = weight.shape[1]
    n = out.shape[-1]  # output columns: half the weight's rows when gated
    wide = rows > WIDE_ROWS
    tiles = tiles or Tiles(BLOCK_N, WIDE_GATED_BLOCK_K if wide and gated else BLOCK_K)
    block_k = tiles.block_k
    k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    assert x.stride(1) == weight.stride(1) == out.stride(-1) == 1 and triton.cdiv(k, k_per_split) == splits
    assert weight.shape[0] == (2 * n if gated else n)
    if scale is not None:  # K-tiles inside one scale block; gate and up rows in blocks of their own
        assert scale.dtype == torch.float32 and scale.stride(1) == 1 and SCALE_BLOCK % block_k == 0
        assert scale.shape == (triton.cdiv(weight.shape[0], SCALE_BLOCK), triton.cdiv(k, SCALE_BLOCK))
        assert not gated or n % SCALE_BLOCK == 0
    tile_cols = tiles.block_n // 2 if gated else tiles.block_n
    programs = triton.cdiv(n, tile_cols)
    stages = tiles.num_stages or (WIDE_STAGES if wide else _num_stages(programs * splits, x.device))
    _skinny_gemm_kernel[(programs, splits)](
        x,
        weight,
        scale,
        out,
        rows,
        n,
        k,
        k_per_split,
        x.stride(0),
        weight.stride(0),
        None if scale is None else scale.stride(0),  # None: the bf16 kernel compiles as before
        out.stride(0) if out.dim() == 3 else 0,
        out.stride(-2),
        BLOCK_M=max(16, triton.next_power_of_2(rows)),
        BLOCK_N=tiles.block_n,
        BLOCK_K=block_k,
        GATED=gated,
        SCALE_BLOCK=0 if scale is None else SCALE_BLOCK,
        EVEN=n % tile_cols == 0 and k % (splits * block_k) == 0,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        PREFETCH_TILES=prefetch_tiles,
        DEPENDENTS_EARLY=dependents_early,
        num_warps=tiles.num_warps,
        num_stages=stages,
        **pdl_launch(x),
    )


def nonempty_splits(k: int, splits: int, block_k: int) -> int:
    """How many slices of whole block_k tiles `splits` slices of K come to once none is empty (512 columns in 3
    slices of 128-wide tiles: 2 slices of 256)."""
    return triton.cdiv(k, triton.cdiv(triton.cdiv(k, splits), block_k) * block_k)


def _skinny(x: torch.Tensor, invariant: bool, max_rows: int = SKINNY_MAX_ROWS) -> bool:
    return not invariant and use_triton(x) and 0 < x.shape[0] <= max_rows


def _dense(x: torch.Tensor, weight: torch.Tensor, invariant: bool) -> torch.Tensor:
    """The product outside the skinny kernel: cuBLAS, or the batch-invariant kernel."""
    return invariant_linear(x, weight) if invariant else F.linear(x, weight)


def linear(
    x: torch.Tensor, weight: torch.Tensor, dependents_early: bool = False, invariant: bool = False
) -> torch.Tensor:
    """x [T, K] @ weight[N, K]^T -> [T, N] in x's dtype. dependents_early: let the next kernel launch as this
    one starts, not as it ends (qkv, before the attention inputs' one-warp programs: see layers/attention.py)."""
    if not _skinny(x, invariant):
        return _dense(x, weight, invariant)
    return skinny_linear(x, weight, dependents_early)


def gated_linear(
    x: torch.Tensor,
    gate_up_weight: torch.Tensor,
    dependents_early: bool = False,
    invariant: bool = False,
) -> torch.Tensor:
    """silu(x @ W_gate^T) * (x @ W_up^T) for the fused weight [2I, K] (gate rows, then up rows) -> [T, I].
    In the skinny kernel's epilogue, so a step of few rows launches no separate silu_mul. dependents_early: see
    mlp_partials."""
    if not _skinny(x, invariant, FUSED_MAX_ROWS):
        return silu_mul(_dense(x, gate_up_weight, invariant))
    return skinny_gated_linear(x, gate_up_weight, dependents_early)


def linear_partials(
    x: torch.Tensor,
    weight: torch.Tensor,
    splits: int | None = None,
    launched_early: bool = False,
    invariant: bool = False,
) -> torch.Tensor:
    """x @ weight^T as [S, T, N] fp32 partial sums over S slices of K ([1, T, N] in x's dtype from
    cuBLAS), for `add_rms_norm` to add up. By default the N / BLOCK_N column tiles x S programs are
    one per SM at most, with slices of at least 4 K-tiles (whole tiles, the last slice shorter where K
    does not divide): Qwen3-4B's o_proj and down_proj (40 tiles) take 3 slices, 120 programs of 6
    stages, faster than 4 equal slices (160 programs of 4 stages), which leave some SMs two programs.
    launched_early: the kernel before lets this one launch as it starts, so each program requests its
    slice's first weight tile of each row before its wait."""
    if not _skinny(x, invariant, FUSED_MAX_ROWS):
        return _dense(x, weight, invariant)[None]
    return skinny_partials(x, weight, splits, launched_early)


# The skinny kernel's launches for the rows it takes, for bf16 weights and (with `scale`) block-FP8 ones.


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, dependents_early: bool = False, scale: torch.Tensor | None = None
) -> torch.Tensor:
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    _launch(
        x, weight, out, splits=1, prefetch_tiles=_prefetch_tiles(weight), dependents_early=dependents_early, scale=scale
    )
    return out


def skinny_gated_linear(
    x: torch.Tensor, gate_up_weight: torch.Tensor, dependents_early: bool = False, scale: torch.Tensor | None = None
) -> torch.Tensor:
    out = torch.empty(x.shape[0], gate_up_weight.shape[0] // 2, dtype=x.dtype, device=x.device)
    _launch(
        x,
        gate_up_weight,
        out,
        splits=1,
        gated=True,
        prefetch_tiles=_prefetch_tiles(gate_up_weight),
        dependents_early=dependents_early,
        tiles=GATED_WIDE_TILES if x.shape[0] > SKINNY_MAX_ROWS else None,
        scale=scale,
    )
    return out


def skinny_partials(
    x: torch.Tensor,
    weight: torch.Tensor,
    splits: int | None = None,
    launched_early: bool = False,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    n, k = weight.shape
    if splits is None:
        splits = max(1, min(num_sms(x.device) // triton.cdiv(n, BLOCK_N), k // (4 * BLOCK_K)))
    splits = nonempty_splits(k, splits, BLOCK_K)
    out = torch.empty(splits, x.shape[0], n, dtype=torch.float32, device=x.device)
    tiles = _prefetch_tiles(weight)
    if splits > 1:  # a slice's first tile, inside the row: every slice starts on a tile of a whole-tile K
        tiles = min(tiles, 1) if launched_early and k % BLOCK_K == 0 else 0
    _launch(x, weight, out, splits, prefetch_tiles=tiles, scale=scale)
    return out


def skinny_fp32_partials(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """x @ weight^T as [S, T, N] fp32 partial sums by the skinny kernel where it takes x (up to FUSED_MAX_ROWS rows),
    else None: for a small product whose consumer adds the partials itself (the MoE router's logits, which routing
    sums), where cuBLAS's fp32-output product is slower at decode sizes."""
    return linear_partials(x, weight) if _skinny(x, False, FUSED_MAX_ROWS) else None


def mlp_partials(
    x: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    invariant: bool = False,
) -> torch.Tensor:
    """down_proj(silu(gate) * up) as [S, T, hidden] partial sums, like `linear_partials`; up to
    MLP_EARLY_ROWS rows down_proj launches as gate/up starts and requests its first weight tiles early."""
    early = _skinny(x, invariant) and x.shape[0] <= MLP_EARLY_ROWS
    gated = gated_linear(x, gate_up_weight, dependents_early=early, invariant=invariant)
    return linear_partials(gated, down_weight, launched_early=early, invariant=invariant)
