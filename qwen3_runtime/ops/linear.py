"""Projections of a few rows (decode) as a Triton skinny GEMM: y = x @ W^T with W [N, K] row-major.

A decode step only streams weights, so what matters is keeping enough loads in flight on every
SM. cuBLAS reaches 52-79% of the copy bandwidth on Qwen3-4B's projections at 1-16 rows
(scripts/bench_kernels.py, H200): worst on the two with few output columns (o_proj and down_proj,
N = hidden size), where too few tiles cover the GPU. There each program takes one of `splits`
slices of K and writes an fp32 partial sum; the partials are added by the next kernel, the
residual add + RMSNorm (`add_rms_norm`), so the split costs no extra launch and no atomics.
Larger batches and prefill go to cuBLAS: launched eagerly, a Triton kernel costs more host time
than a cuBLAS call (decode hides that in its CUDA graph).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwen3_runtime.ops import num_sms, use_triton

# Up to this many rows the skinny kernel beats cuBLAS on the H200 (at 32 cuBLAS wins on the wide ones).
SKINNY_MAX_ROWS = 16
BLOCK_K = 128
# Programs wanted per SM: enough independent weight streams to cover the memory latency.
PROGRAMS_PER_SM = 2


@triton.jit
def _skinny_gemm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, k_per_split, stride_xm, stride_wn, stride_os, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        EVEN: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Program (column tile, split): out[split, :M, tile] = x[:, slice] @ W[tile, slice]^T."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = split * k_per_split + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    m_mask = offs_m[:, None] < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, k_per_split, BLOCK_K):
        if EVEN:  # N and K are whole tiles: unmasked weight loads
            w = tl.load(w_ptrs)
            x_mask = m_mask
        else:
            k_mask = (offs_k[None, :] + k) < K
            x_mask = m_mask & k_mask
            w = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & k_mask, other=0.0)
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out = out_ptr + split * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask & (offs_n[None, :] < N))


def _launch(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, splits: int, block_n: int) -> None:
    rows = x.shape[0]
    n, k = weight.shape
    k_per_split = triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K
    assert x.stride(1) == weight.stride(1) == out.stride(-1) == 1 and triton.cdiv(k, k_per_split) == splits
    _skinny_gemm_kernel[(triton.cdiv(n, block_n), splits)](
        x, weight, out, rows, n, k, k_per_split, x.stride(0), weight.stride(0),
        out.stride(0) if out.dim() == 3 else 0, out.stride(-2),
        BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=block_n, BLOCK_K=BLOCK_K,
        EVEN=n % block_n == 0 and k % (splits * BLOCK_K) == 0,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=4, num_stages=4)


def _skinny(x: torch.Tensor, decode: bool) -> bool:
    return decode and use_triton(x) and 0 < x.shape[0] <= SKINNY_MAX_ROWS


def linear(x: torch.Tensor, weight: torch.Tensor, decode: bool = True) -> torch.Tensor:
    """x [T, K] @ weight[N, K]^T -> [T, N] in x's dtype."""
    if not _skinny(x, decode):
        return F.linear(x, weight)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    # Wide outputs have tiles to spare: narrower tiles give more programs per SM.
    _launch(x, weight, out, splits=1, block_n=32 if weight.shape[0] >= 16384 else 64)
    return out


def linear_partials(x: torch.Tensor, weight: torch.Tensor, decode: bool = True,
                    splits: int | None = None) -> torch.Tensor:
    """x @ weight^T as [S, T, N] fp32 partial sums over S slices of K ([1, T, N] in x's dtype from
    cuBLAS), for `add_rms_norm` to add up. By default S makes N / 32 column tiles x S fill the GPU,
    with slices of at least 4 K-tiles."""
    if not _skinny(x, decode):
        return F.linear(x, weight)[None]
    n, k = weight.shape
    block_n = 32
    if splits is None:
        wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms(x.device), triton.cdiv(n, block_n))
        splits = max(1, min(wanted, k // (4 * BLOCK_K)))
    splits = triton.cdiv(k, triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K)  # no empty slice
    out = torch.empty(splits, x.shape[0], n, dtype=torch.float32, device=x.device)
    _launch(x, weight, out, splits, block_n)
    return out
