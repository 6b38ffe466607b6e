"""Fused elementwise kernels of a Qwen3 layer, so a decode step launches ~11 kernels per layer
instead of ~60 (inside a CUDA graph each launch still costs ~2 µs):

- `add_rms_norm`: residual += delta, then RMSNorm of the new residual (one pass);
- `qk_norm_rope`: per-head RMSNorm of q and k, then half-split rotary embedding, read straight
  from the fused qkv projection;
- `silu_mul`: silu(gate) * up from the fused gate/up projection.

Rounding follows Hugging Face's bf16 semantics where it is observable: the residual is rounded to
the model dtype before it is normalised, and the normalised value is rounded before the weight
multiplies it. Each kernel has a plain PyTorch reference, used on the CPU by default.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwen3_runtime.ops import use_triton


@triton.jit
def _add_rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, n_cols, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(residual_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(residual_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * n_cols + cols, x, mask=mask)
        x = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (normed * weight).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm(x) or, with `residual`, residual += x (in place) and RMSNorm(residual). x is [T, D]."""
    if not use_triton(x):
        return add_rms_norm_reference(x, weight, eps, residual)
    out = torch.empty_like(x)
    if x.shape[0]:
        _add_rms_norm_kernel[(x.shape[0],)](x, x if residual is None else residual, weight, out, x.shape[1], eps,
                                            HAS_RESIDUAL=residual is not None,
                                            BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=4)
    return out


def add_rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                           residual: torch.Tensor | None = None) -> torch.Tensor:
    if residual is not None:
        residual.add_(x)
        x = residual
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, q_weight_ptr, k_weight_ptr, cos_sin_ptr, positions_ptr, q_ptr, k_ptr,
                         num_heads, num_kv_heads, qkv_stride, head_dim, eps,
                         HALF_BLOCK: tl.constexpr):
    """One program per (token, head); heads past num_heads are k heads."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    half = head_dim // 2
    offs = tl.arange(0, HALF_BLOCK)
    mask = offs < half
    src = qkv_ptr + token * qkv_stride + head * head_dim
    x1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half + offs, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / head_dim + eps)
    dtype = q_ptr.dtype.element_ty
    if head < num_heads:
        w1 = tl.load(q_weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(q_weight_ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
        dst = q_ptr + (token * num_heads + head) * head_dim
    else:
        w1 = tl.load(k_weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(k_weight_ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
        dst = k_ptr + (token * num_kv_heads + head - num_heads) * head_dim
    x1 = ((x1 * inv_rms).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
    x2 = ((x2 * inv_rms).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + position * head_dim + offs, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(cos_sin_ptr + position * head_dim + half + offs, mask=mask, other=0.0).to(dtype).to(tl.float32)
    tl.store(dst + offs, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(dst + half + offs, (x2 * cos + x1 * sin).to(dtype), mask=mask)


def qk_norm_rope(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] and k [T, KVH, D], normed per head and rotated, from qkv [T, (H + 2 KVH) D].
    `cos_sin` is [max_len, D]: cos over the first half of each row, sin over the second."""
    if not use_triton(qkv):
        return qk_norm_rope_reference(qkv, num_heads, num_kv_heads, q_weight, k_weight, cos_sin, positions, eps)
    tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens:
        _qk_norm_rope_kernel[(tokens, num_heads + num_kv_heads)](
            qkv, q_weight, k_weight, cos_sin, positions, q, k, num_heads, num_kv_heads, qkv.stride(0), head_dim,
            eps, HALF_BLOCK=triton.next_power_of_2(head_dim // 2), num_warps=1)
    return q, k


def qk_norm_rope_reference(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, q_weight: torch.Tensor,
                           k_weight: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    cos, sin = cos_sin[positions].to(qkv.dtype)[:, None, :].chunk(2, dim=-1)

    def norm_rope(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = add_rms_norm_reference(x, weight, eps)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return (norm_rope(q.reshape(tokens, num_heads, head_dim), q_weight),
            norm_rope(k.reshape(tokens, num_kv_heads, head_dim), k_weight))


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_up_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (silu * up).to(dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2 I] -> [T, I]."""
    if not use_triton(gate_up):
        return silu_mul_reference(gate_up)
    tokens, n_cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, n_cols, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    if tokens:
        _silu_mul_kernel[(tokens, triton.cdiv(n_cols, block))](gate_up, out, n_cols, BLOCK=block, num_warps=4)
    return out


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
