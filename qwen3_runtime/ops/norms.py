"""Fused elementwise kernels of a Qwen3 layer, so a decode step launches 9 kernels per layer
instead of ~60 (each launch has a fixed cost, even inside a CUDA graph):

- `add_rms_norm`: residual += delta, then RMSNorm of the new residual (one pass);
- `silu_mul`: silu(gate) * up from the fused gate/up projection (prefill; decode applies it in the
  projection's epilogue, `ops.linear.gated_linear`).
(q/k norm, RoPE and the KV-cache store are fused in `attention_inputs`.)

Rounding follows Hugging Face's bf16 semantics where it is observable: the residual is rounded to
the model dtype before it is normalised, and the normalised value is rounded before the weight
multiplies it. Each kernel has a plain PyTorch reference, used on the CPU by default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import pdl_launch, use_triton


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    n_cols,
    stride_part,
    eps,
    NUM_PARTS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # No kernel writes the weight, so it is read while the predecessor finishes, not after the reduction.
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if USE_PDL:  # the next kernel (a projection) may launch now and wait; this one waits for its predecessor
        gdc_launch_dependents()
        gdc_wait()
    dtype = out_ptr.dtype.element_ty
    x = tl.zeros([BLOCK], tl.float32)
    for part in tl.static_range(NUM_PARTS):  # a split projection's partial sums, loads issued together
        x += tl.load(x_ptr + part * stride_part + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x.to(dtype).to(tl.float32)  # the projection's output, rounded as an unsplit one would be
        x = x + tl.load(residual_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(dtype)
        tl.store(residual_ptr + row * n_cols + cols, x, mask=mask)
        x = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * inv_rms).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (normed * weight).to(dtype), mask=mask)


def add_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm(x) or, with `residual`, residual += x (in place) and RMSNorm(residual). x is [T, D], or
    with `residual` also [S, T, D]: partial sums of a split projection (`linear_partials`), added first."""
    if not use_triton(x):
        return add_rms_norm_reference(x, weight, eps, residual)
    parts = x if x.dim() == 3 else x[None]
    assert parts.is_contiguous() and (residual is not None or x.dim() == 2)
    out = torch.empty(parts.shape[1:], dtype=x.dtype if residual is None else residual.dtype, device=x.device)
    block = triton.next_power_of_2(out.shape[1])
    if out.shape[0]:
        _add_rms_norm_kernel[(out.shape[0],)](
            parts,
            x if residual is None else residual,
            weight,
            out,
            out.shape[1],
            parts.stride(0),
            eps,
            NUM_PARTS=parts.shape[0],
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=_norm_warps(block),
            **pdl_launch(x),
        )
    return out


def _norm_warps(block: int) -> int:
    """A warp per 128 columns (4 per thread), 4 to 32: at a few rows the norm is one latency-bound program
    per row, and more threads issue its loads sooner (Qwen3-4B's 2560 columns: 32 warps)."""
    return min(32, max(4, block // 128))


def add_rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    if residual is not None:
        if x.dim() == 3:
            x = x.sum(0, dtype=torch.float32).to(residual.dtype)
        residual.add_(x)
        x = residual
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:  # launched early (ops.pdl_launch): wait for the previous kernel's writes
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_up_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (silu * up).to(dtype), mask=mask)
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2 I] -> [T, I]."""
    if not use_triton(gate_up):
        return silu_mul_reference(gate_up)
    tokens, n_cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, n_cols, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    if tokens:
        _silu_mul_kernel[(tokens, triton.cdiv(n_cols, block))](
            gate_up, out, n_cols, BLOCK=block, num_warps=4, **pdl_launch(gate_up)
        )
    return out


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
