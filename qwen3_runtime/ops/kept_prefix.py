"""How many of each row's sorted processed logits top-k then top-p keep (sampler.filter_cutoffs): the count of
`filter_sorted`'s finite entries, without its [B, V] float64 tensors (probabilities, their running sum, the
mass before each token), which at large batches cost more than the sort before them.

Two kernels, one program per (row, chunk of the sorted row): each chunk's mass (float64 sum of exp(value - the
row's first, largest, value)); then each chunk counts its kept tokens, the mass before a token being the mass of
the chunks before it (summed in a fixed order) plus its running sum inside the chunk, all over the row's total.
The counts are integers, so adding them atomically is exact. Sums in another order than PyTorch's make a token
sitting within float64 rounding of the top-p boundary the only place where the two can differ.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import use_triton

CHUNK = 2048


@triton.jit
def _row_width(top_k_ptr, row, width):
    """Entries top-k leaves (all `width` when top_k <= 0)."""
    k = tl.load(top_k_ptr + row)
    return tl.where(k > 0, tl.minimum(k, width), width)


@triton.jit
def _exp_from_first(sorted_ptr, row, stride_row, ids, keep_width):
    """(value, exp(value - the row's first value)) in float64 for `ids`, -inf and 0 from keep_width on."""
    x = tl.load(sorted_ptr + row * stride_row + ids, mask=ids < keep_width, other=float("-inf")).to(tl.float64)
    first = tl.load(sorted_ptr + row * stride_row).to(tl.float64)
    return x, tl.exp(x - first)


@triton.jit
def _chunk_mass_kernel(sorted_ptr, top_k_ptr, mass_ptr, width, stride_row, num_chunks, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    _, e = _exp_from_first(sorted_ptr, row, stride_row, ids, _row_width(top_k_ptr, row, width))
    tl.store(mass_ptr + row * num_chunks + tl.program_id(1), tl.sum(e, axis=0))


@triton.jit
def _chunk_kept_kernel(
    sorted_ptr, top_k_ptr, top_p_ptr, mass_ptr, kept_ptr, width, stride_row, num_chunks,
    CHUNK: tl.constexpr, CHUNKS_PAD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.arange(0, CHUNKS_PAD)
    mass = tl.load(mass_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=0.0)
    total = tl.sum(mass, axis=0)
    before = tl.sum(tl.where(chunks < chunk, mass, 0.0), axis=0) / total
    keep_width = _row_width(top_k_ptr, row, width)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x, e = _exp_from_first(sorted_ptr, row, stride_row, ids, keep_width)
    prob = e / total
    mass_before = before + tl.cumsum(prob, axis=0) - prob
    top_p = tl.load(top_p_ptr + row).to(tl.float64)
    limit = tl.where(top_p < 1.0, top_p, float("inf"))  # top_p >= 1: off
    kept = (ids < keep_width) & (x > float("-inf")) & (mass_before <= limit)
    tl.atomic_add(kept_ptr + row, tl.sum(kept.to(tl.int32), axis=0))


def kept_prefix(sorted_values: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B] int64: per row of fp32 values sorted descending [B, W] (ties: the lower id first), how many leading
    entries top_k (int [B], <= 0: off) then top_p (f32 [B], >= 1: off) keep: `filter_sorted`'s finite count.
    Allocates only by (B, W): capturable in a CUDA graph."""
    if not use_triton(sorted_values):
        return (filter_sorted(sorted_values, top_k, top_p) != float("-inf")).sum(dim=-1)
    rows, width = sorted_values.shape
    assert sorted_values.dtype == torch.float32 and sorted_values.stride(1) == 1
    assert top_k.shape == top_p.shape == (rows,) and top_p.dtype == torch.float32
    num_chunks = triton.cdiv(width, CHUNK)
    mass = torch.empty(rows, num_chunks, dtype=torch.float64, device=sorted_values.device)
    kept = torch.zeros(rows, dtype=torch.int32, device=sorted_values.device)
    if rows:
        grid = (rows, num_chunks)
        stride = sorted_values.stride(0)
        _chunk_mass_kernel[grid](sorted_values, top_k, mass, width, stride, num_chunks, CHUNK=CHUNK)
        _chunk_kept_kernel[grid](
            sorted_values, top_k, top_p, mass, kept, width, stride, num_chunks,
            CHUNK=CHUNK, CHUNKS_PAD=triton.next_power_of_2(num_chunks),
        )  # fmt: skip
    return kept.long()


def filter_sorted(sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Rows in descending order (ties: the lower id first), -inf from each row's top_k-th on (top_k <= 0: off)
    and past the smallest prefix holding top_p of what is left's mass, summed in float64 (in float32 the
    running sum over ~150k probabilities reaches 1 early and masks tail tokens even at top_p = 1, which is
    therefore skipped outright)."""
    width = sorted_logits.shape[-1]
    rank = torch.arange(width, device=sorted_logits.device)[None, :]
    k = torch.where(top_k > 0, top_k.long(), width)[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1, dtype=torch.float64)
    mass_before = probs.cumsum(dim=-1).sub_(probs)
    outside = (mass_before > top_p[:, None]) & (top_p < 1)[:, None]
    return sorted_logits.masked_fill(outside, float("-inf"))
