"""A batch-invariant product y = x @ W^T (engine.batch_invariant): every output element is computed by the same
instructions in the same order whatever the number of rows, so a token's result does not depend on the batch
it runs in.

cuBLAS picks its kernel, tile and split-K by the shape, so a row's sums are rounded differently at M = 7 and
M = 300. Here the tiles are fixed: each program takes a BLOCK_M x BLOCK_N tile of the output and runs the whole
of K in BLOCK_K steps, accumulating in fp32; rows only ever meet in different tiles, and an element's result
depends on its own row and column alone. Programs that share a weight tile run next to each other, so the
weights stream from DRAM about once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Fixed for every M (that is the point), so sized for the prefills that dominate the mode's time (the common
# Hopper choice: two warpgroups of 64 rows each, three K-steps in flight); a decode step's few rows waste tensor
# core work, not weight reads.
BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64
NUM_WARPS, NUM_STAGES = 8, 3


@triton.jit(do_not_specialize=["M"])
def _invariant_matmul_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Program (row tile, column tile), the row tile varying fastest. M is not specialized on: the
    compiled kernel is the same for every batch. UPCAST: fp32 operands (the interpreter's bf16 dot)."""
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % num_m
    pid_n = tl.program_id(0) // num_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # W^T tile [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, K, BLOCK_K):
        k_mask = offs_k + k < K
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=(offs_n[None, :] < N) & k_mask[:, None], other=0.0)
        if UPCAST:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T -> [M, N] in out_dtype (default x's), each element independent of M.
    Triton only (a CUDA device, or the interpreter): the engine refuses batch_invariant elsewhere."""
    rows, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x.stride(1) == weight.stride(1) == 1 and x.dtype == weight.dtype
    out = torch.empty(rows, n, dtype=out_dtype or x.dtype, device=x.device)
    if rows == 0:
        return out
    grid = (triton.cdiv(rows, BLOCK_M) * triton.cdiv(n, BLOCK_N),)
    _invariant_matmul_kernel[grid](
        x, weight, out, rows, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        UPCAST=not x.is_cuda and x.dtype != torch.float32,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return out


def invariant_linear_reference(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None):
    """The product in float64, rounded once: what the kernel is held to (within fp32 accumulation's error)."""
    return (x.double() @ weight.double().t()).to(out_dtype or x.dtype)
