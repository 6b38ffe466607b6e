"""The kernels of ops/fp8_linear.py's prefill path (W8A8 on the FP8 tensor cores), and the e4m3 helpers they share.

- `quantize_groups_kernel`: x [T, K] -> e4m3 [T, K] and fp32 scales [T, ceil(K / 128)], one scale per token and
  128-column group, amax / 448 (1 for an all-zero group), the value divided by it, saturated to +-448 and rounded to
  the nearest e4m3 (ties to even).
- `w8a8_kernel`: out = (A * a_scale) @ (W * w_scale)^T over e4m3 A [M, K] and W [N, K], each K-tile of 128 columns
  one FP8 tensor-core product, scaled in fp32 by its rows' activation scales and its columns' weight scales, added to
  an fp32 accumulator (the per-block promotion DeepSeek's and vLLM's block-FP8 GEMMs do: a tensor core's own FP8
  accumulation never runs past one block). Optionally the silu(gate) * up epilogue of the fused gate/up weight.

Triton's interpreter stores FP8 as bytes and its float -> e4m3 cast truncates wrongly (1.9 x 2^k becomes 2^k), so in
the interpreter alone the quantizer first rounds to the e4m3 grid in fp32 (`e4m3_grid`), which the cast then keeps.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

E4M3_MAX = tl.constexpr(448.0)  # the largest finite e4m3 value


@triton.jit
def e4m3_grid(v):
    """The e4m3 value nearest v (|v| <= 448), ties to even, in fp32: 3 mantissa bits kept by the carry trick on the
    bits of normals, multiples of 2^-9 below 2^-6 (subnormals) by adding and removing 2^14."""
    a = tl.abs(v)
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    subnormal = (a + 16384.0) - 16384.0
    r = tl.where(a < 0.015625, subnormal, normal).to(tl.uint32, bitcast=True)
    return (r | (v.to(tl.uint32, bitcast=True) & 0x80000000)).to(tl.float32, bitcast=True)  # v's sign, -0 too


@triton.jit
def quantize_groups_kernel(
    x_ptr, q_ptr, scale_ptr, T, K, stride_x, stride_q, stride_s,
    BLOCK_T: tl.constexpr, GROUP: tl.constexpr, INTERPRET: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Program (row block, group): BLOCK_T rows of one GROUP-column group."""
    if USE_PDL:  # x comes from the previous kernel
        gdc_wait()
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * GROUP + tl.arange(0, GROUP)
    mask = (rows[:, None] < T) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, amax / E4M3_MAX, 1.0)
    q = tl.minimum(tl.maximum(x / scale[:, None], -E4M3_MAX), E4M3_MAX)
    if INTERPRET:
        q = e4m3_grid(q)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_q + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + rows.to(tl.int64) * stride_s + tl.program_id(1), scale, mask=rows < T)
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count (batch-invariant mode)
def w8a8_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, out_ptr, M, N, K,
    stride_am, stride_as, stride_wn, stride_ws, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """Program pid: an output tile of BLOCK_M rows and BLOCK_N weight rows, GROUP_M row tiles side by side over the
    column tiles (their weight tiles re-read from L2). GATED: W is the fused gate/up weight [2N, K], the tile's weight
    rows alternating a gate row and its up row, and out[:, tile] = silu(gate) * up (rounded as the unfused projection
    and silu_mul round). Each BLOCK_K tile lies in one scale block (BLOCK_K divides SCALE_BLOCK). UPCAST: the
    interpreter's dot, in fp32."""
    if USE_PDL:  # A and its scales come from the previous kernel
        gdc_wait()
    tile_cols: tl.constexpr = BLOCK_N // 2 if GATED else BLOCK_N
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, tile_cols)
    pid = tl.program_id(0)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m, pid_n = first_m + (pid % per_group) % group_size, (pid % per_group) // group_size
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if GATED:
        cols = pid_n * tile_cols + tl.arange(0, BLOCK_N) // 2
        w_rows = cols + (tl.arange(0, BLOCK_N) % 2) * N
    else:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        w_rows = cols
    a_rows = tl.where(rows < M, rows, 0)  # rows and columns past the ends read row 0 and are never stored
    w_rows = tl.where(cols < N, w_rows, 0)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + w_rows[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # W^T tile [BLOCK_K, BLOCK_N]
    a_scales = a_scale_ptr + a_rows.to(tl.int64) * stride_as
    w_scales = w_scale_ptr + (w_rows // SCALE_BLOCK) * stride_ws
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_mask = offs_k + k < K
            a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        block = k // SCALE_BLOCK
        a_s = tl.load(a_scales + block)
        w_s = tl.load(w_scales + block)
        if UPCAST:
            part = tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(a, w)
        acc += part * a_s[:, None] * w_s[None, :]
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    dtype = out_ptr.dtype.element_ty
    if GATED:
        gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        gate, up = gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32)
        acc = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up
        cols = pid_n * tile_cols + tl.arange(0, tile_cols)
    out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(dtype), mask=(rows[:, None] < M) & (cols[None, :] < N))
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()
