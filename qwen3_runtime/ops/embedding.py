"""The decode step's first kernel: each row's input token and its embedding row, in one launch.

With async scheduling a row's input token may be the one the step still in flight sampled for it
(prev_row >= 0: that step's row), read on the device from that step's packed results. One kernel,
where the selection and the embedding in PyTorch take several launches at the head of every decode step."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwen3_runtime.ops import use_triton

BLOCK = 1024


@triton.jit
def _embed_kernel(
    input_ids_ptr,
    prev_row_ptr,
    sampled_ptr,
    stride_sampled,
    weight_ptr,
    out_ptr,
    hidden,
    stride_weight,
    stride_out,
    HAS_PREV: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    token = tl.load(input_ids_ptr + row).to(tl.int64)
    if HAS_PREV:  # row 0 of the step in flight always exists, so the clamped load is always in bounds
        prev = tl.load(prev_row_ptr + row).to(tl.int64)
        fed = tl.load(sampled_ptr + tl.maximum(prev, 0) * stride_sampled).to(tl.int64)
        token = tl.where(prev >= 0, fed, token)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    tl.store(
        out_ptr + row * stride_out + cols, tl.load(weight_ptr + token * stride_weight + cols, mask=mask), mask=mask
    )


def embed(
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    prev_row: torch.Tensor | None = None,
    sampled: torch.Tensor | None = None,
    *,
    reference: bool = False,
) -> torch.Tensor:
    """Embedding rows [T, hidden] of input_ids [T], except that a row with prev_row >= 0 takes the token
    sampled[prev_row] (`sampled`: one id per row of the step in flight, any stride).
    `reference`: the PyTorch path even where Triton runs (`embed_reference`)."""
    if reference or not use_triton(weight):
        if prev_row is not None:
            input_ids = torch.where(prev_row >= 0, sampled[prev_row.clamp(min=0)].long(), input_ids)
        return F.embedding(input_ids, weight)
    assert (prev_row is None) == (sampled is None) and weight.stride(1) == 1
    tokens, hidden = input_ids.shape[0], weight.shape[1]
    out = torch.empty(tokens, hidden, dtype=weight.dtype, device=weight.device)
    if tokens:
        has_prev = prev_row is not None
        _embed_kernel[(tokens, triton.cdiv(hidden, BLOCK))](
            input_ids,
            prev_row if has_prev else input_ids,
            sampled if has_prev else input_ids,
            sampled.stride(0) if has_prev else 0,
            weight,
            out,
            hidden,
            weight.stride(0),
            out.stride(0),
            HAS_PREV=has_prev,
            BLOCK=BLOCK,
            num_warps=4,
        )
    return out


# The same function in PyTorch (several launches); for CPUs without Triton, and tests.
embed_reference = functools.partial(embed, reference=True)
