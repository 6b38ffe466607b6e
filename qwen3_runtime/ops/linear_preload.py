"""The attention output projection (o_proj) of up to 8 decode rows with its weights requested into
shared memory before the PDL wait (Gluon; Hopper's TMA and wgmma).

Between qkv and o_proj a decode layer runs latency-bound attention kernels while the DRAM idles.
Launched early (`paged_decode_attention(..., dependents_early=True)`), this kernel's programs are
resident during attention, each streaming its whole share of the weights (one 64-column tile, one
slice of K, at most one program per SM) into shared memory; after the wait only the attention output
is loaded and the MMAs run, so the weight stream overlaps attention instead of following it.
Larger batches keep the skinny kernel: attention's own programs then leave no SM room for ~200 KB of
weights.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import TRITON_INTERPRET, num_sms, pdl_launch

TILE_N, TILE_K = 64, 128
MAX_ROWS = 8
# Shared memory one program may take, of the 228 KB of a Hopper SM: no three-stage attention program
# (37 KB) fits beside one, so its programs take SMs as attention's leave them (where attention has more
# than two programs an SM it runs one stage instead: decode_attention.STAGES_BESIDE_PRELOAD).
SMEM_BUDGET = 200 * 1024
# Gluon's TMA load is async_copy_global_to_shared up to triton 3.6, async_load after (the CPU tests' triton).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _preload_gemm_kernel(
    w_desc,
    x_desc,
    out_ptr,
    M,
    N,
    k_tiles,
    total_k_tiles,
    stride_os,
    stride_om,
    MAX_K_TILES: gl.constexpr,
    USE_PDL: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Program (column tile, split): out[split, :M, tile] = (W[tile, slice] @ x[:, slice]^T)^T, the slice's
    k_tiles weight tiles all resident in shared memory (the last slice may be shorter)."""
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    TILE_BYTES: gl.constexpr = (BLOCK_N + BLOCK_M) * BLOCK_K * 2
    row = gl.program_id(0) * BLOCK_N
    first = gl.program_id(1) * k_tiles
    n_k = gl.minimum(k_tiles, total_k_tiles - first)

    w_smem = gl.allocate_shared_memory(w_desc.dtype, [MAX_K_TILES, BLOCK_N, BLOCK_K], w_desc.layout)
    x_smem = gl.allocate_shared_memory(x_desc.dtype, [MAX_K_TILES, BLOCK_M, BLOCK_K], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [MAX_K_TILES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(MAX_K_TILES):
        mbarrier.init(ready.index(s), count=1)
    fence_async_shared()
    # The weights are never written: all of them are requested before waiting for the previous kernel.
    for s in gl.static_range(MAX_K_TILES):
        mbarrier.expect(ready.index(s), TILE_BYTES, pred=s < n_k)
        _tma_load(w_desc, [row, (first + s) * BLOCK_K], ready.index(s), w_smem.index(s), pred=s < n_k)
    if USE_PDL:
        gdc_wait()
    for s in gl.static_range(MAX_K_TILES):
        _tma_load(x_desc, [0, (first + s) * BLOCK_K], ready.index(s), x_smem.index(s), pred=s < n_k)

    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16]
    )
    acc = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, layout=mma)
    for i in range(n_k):
        mbarrier.wait(ready.index(i), 0)
        acc = warpgroup_mma(w_smem.index(i), x_smem.index(i).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for s in gl.static_range(MAX_K_TILES):
        mbarrier.invalidate(ready.index(s))

    cols = row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
    out = out_ptr + gl.program_id(1) * stride_os + rows[None, :] * stride_om + cols[:, None]
    gl.store(out, acc, mask=(rows[None, :] < M) & (cols[:, None] < N))
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()


def preload_plan(n: int, k: int, sms: int) -> tuple[int, int]:
    """(K slices, weight tiles per slice): as many programs as fit one per SM."""
    tiles = triton.cdiv(k, TILE_K)
    per_slice = triton.cdiv(tiles, max(1, sms // triton.cdiv(n, TILE_N)))
    return triton.cdiv(tiles, per_slice), per_slice


def preload_applies(rows: int, weight: torch.Tensor) -> bool:
    """Whether `preloaded_partials` serves this projection: Hopper, bf16, few rows, weights that fit."""
    if not (
        0 < rows <= MAX_ROWS
        and weight.is_cuda
        and weight.dtype == torch.bfloat16
        and not TRITON_INTERPRET
        and _hopper(weight.device)
        and weight.is_contiguous()
        and weight.shape[1] % 8 == 0
    ):
        return False
    _, per_slice = preload_plan(*weight.shape, num_sms(weight.device))
    return per_slice * (TILE_N + MAX_ROWS) * TILE_K * weight.element_size() <= SMEM_BUDGET


@functools.lru_cache
def _hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))


def preloaded_partials(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ weight[N, K]^T as [S, T, N] fp32 partial sums over S slices of K, like
    `linear_partials`, for `add_rms_norm` to add up. Only where `preload_applies`."""
    rows, k = x.shape
    n = weight.shape[0]
    assert x.is_contiguous() and x.dtype == weight.dtype and weight.shape[1] == k
    splits, per_slice = preload_plan(n, k, num_sms(x.device))
    out = torch.empty(splits, rows, n, dtype=torch.float32, device=x.device)
    x_desc = _descriptor(x, [max(8, triton.next_power_of_2(rows)), TILE_K])
    _preload_gemm_kernel[(triton.cdiv(n, TILE_N), splits)](
        _descriptor(weight, [TILE_N, TILE_K]),
        x_desc,
        out,
        rows,
        n,
        per_slice,
        triton.cdiv(k, TILE_K),
        out.stride(0),
        out.stride(1),
        MAX_K_TILES=per_slice,
        num_warps=4,
        **pdl_launch(x),
    )
    return out
