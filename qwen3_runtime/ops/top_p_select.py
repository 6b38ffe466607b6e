"""Top-p cutoffs without a sort (sampler.sample_selected): for each random row asking top-p alone, the order key
(sampler.order_keys_reference) of the last token top-p keeps, found by a radix select over the processed values
weighted by their probability mass, as filter_cutoffs finds it by sorting.

Top-p keeps the tokens whose mass ranked before them (larger value, then lower id) is at most top_p of the
row's total. The value's order-preserving bits are searched DIGIT_BITS at a time from the top: a pass over the
row (one program per chunk) sums, per digit, the mass (float64 exp(value - the row's largest), as
ops/kept_prefix.py) and the count of the tokens that share the digits chosen so far; one program per row then adds
the chunks in a fixed order and keeps the lowest digit whose first token is still kept (the mass ranked before
it, that of every larger digit plus what was above, within top_p). After the last digit the kept value is
known, with the mass above it; its tied tokens, ranked by id, each add the same mass, so how many of them stay
is a division, and one more pass over the row counts ties per chunk to find that token's id.

Sums in another order than the sort's make a token sitting within float64 rounding of the boundary the only
place where the two can differ. Rows not asking top-p alone are left as they are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import TRITON_INTERPRET, cdiv
from qwen3_runtime.ops.gumbel_sample import scaling_terms

CHUNK = 2048
DIGIT_BITS = 4
DIGITS = 1 << DIGIT_BITS
LEVELS = 32 // DIGIT_BITS


@triton.jit
def _row_state(row, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, greedy_below,
               LIBDEVICE: tl.constexpr):  # fmt: skip
    """Whether the row asks top-p alone, and its scaling terms (shift, largest processed value, min-p floor)."""
    temperature = tl.load(temperature_ptr + row)
    active = (temperature >= greedy_below) & (tl.load(top_k_ptr + row) <= 0) & (tl.load(top_p_ptr + row) < 1.0)
    shift, top, floor = scaling_terms(tl.load(peak_ptr + row), temperature, tl.load(min_p_ptr + row), LIBDEVICE)
    return active, temperature, shift, top, floor


@triton.jit
def _chunk_values(logits_ptr, row, stride_row, ids, vocab, temperature, shift, floor):
    """The processed values of `ids` (-inf below min-p and past the vocabulary; -0.0 as 0.0) and their order
    bits as int64 in [0, 2**32)."""
    x = tl.load(logits_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    value = tl.math.div_rn(x - shift, temperature)
    value = tl.where(value < floor, float("-inf"), value)
    value = tl.where(value == 0.0, 0.0, value)
    bits = value.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # int32 in the values' order (order_key's high half)
    return value, ordered.to(tl.int64) + 2147483648


@triton.jit
def _digit_pass_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, prefix_ptr, mass_ptr, count_ptr,
    vocab, stride_row, num_chunks, greedy_below, level,
    CHUNK: tl.constexpr, DIGIT_BITS: tl.constexpr, DIGITS: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(0)
    active, temperature, shift, top, floor = _row_state(
        row, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, greedy_below, LIBDEVICE
    )
    if active:
        ids = chunk * CHUNK + tl.arange(0, CHUNK)
        value, key = _chunk_values(logits_ptr, row, stride_row, ids, vocab, temperature, shift, floor)
        low = 32 - DIGIT_BITS * (level + 1)  # the digit's lowest bit
        match = (value > float("-inf")) & ((key >> (low + DIGIT_BITS)) == tl.load(prefix_ptr + row))
        digit = (key >> low) & (DIGITS - 1)
        d = tl.arange(0, DIGITS)
        sums = tl.zeros([DIGITS], tl.float64)
        counts = tl.zeros([DIGITS], tl.int32)
        if tl.sum(match.to(tl.int32), axis=0) > 0:  # deep digits: most chunks hold none of the prefix
            mass = tl.exp(value.to(tl.float64) - top.to(tl.float64))  # as ops/kept_prefix.py
            for b in tl.static_range(DIGITS):
                here = match & (digit == b)
                sums = tl.where(d == b, tl.sum(tl.where(here, mass, 0.0), axis=0), sums)
                counts = tl.where(d == b, tl.sum(here.to(tl.int32), axis=0), counts)
        out = (row * num_chunks + chunk) * DIGITS + d
        tl.store(mass_ptr + out, sums)
        tl.store(count_ptr + out, counts)


@triton.jit
def _digit_choice_kernel(
    temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, prefix_ptr, above_ptr, total_ptr, ties_ptr,
    mass_ptr, count_ptr, num_chunks, greedy_below, level,
    CHUNKS_PAD: tl.constexpr, DIGITS: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    active, _, _, _, _ = _row_state(
        row, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, greedy_below, LIBDEVICE
    )
    if active:
        c = tl.arange(0, CHUNKS_PAD)[:, None]
        d = tl.arange(0, DIGITS)
        at = (row * num_chunks + c) * DIGITS + d[None, :]
        sums = tl.sum(tl.load(mass_ptr + at, mask=c < num_chunks, other=0.0), axis=0)  # chunks in a fixed order
        counts = tl.sum(tl.load(count_ptr + at, mask=c < num_chunks, other=0), axis=0)
        if level == 0:
            total = tl.sum(sums, axis=0)
            above = tl.zeros([], tl.float64)
        else:
            total = tl.load(total_ptr + row)
            above = tl.load(above_ptr + row)
        # The mass ranked before each digit's first token: what was above, then every larger digit's.
        before = above + tl.sum(tl.where(d[None, :] > d[:, None], sums[None, :], 0.0), axis=1)
        kept = (counts > 0) & (before / total <= tl.load(top_p_ptr + row).to(tl.float64))
        chosen = tl.min(tl.where(kept, d, DIGITS), axis=0)
        tl.store(prefix_ptr + row, tl.load(prefix_ptr + row) * DIGITS + chosen)
        tl.store(above_ptr + row, tl.sum(tl.where(d == chosen, before, 0.0), axis=0))
        tl.store(total_ptr + row, total)
        tl.store(ties_ptr + row, tl.sum(tl.where(d == chosen, counts, 0), axis=0))


@triton.jit
def _tie_count_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, prefix_ptr, tie_count_ptr,
    vocab, stride_row, num_chunks, greedy_below, CHUNK: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(0)
    active, temperature, shift, top, floor = _row_state(
        row, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, greedy_below, LIBDEVICE
    )
    if active:
        ids = chunk * CHUNK + tl.arange(0, CHUNK)
        value, key = _chunk_values(logits_ptr, row, stride_row, ids, vocab, temperature, shift, floor)
        tied = (value > float("-inf")) & (key == tl.load(prefix_ptr + row))
        tl.store(tie_count_ptr + row * num_chunks + chunk, tl.sum(tied.to(tl.int32), axis=0))


@triton.jit
def _cutoff_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, prefix_ptr, above_ptr, total_ptr,
    ties_ptr, tie_count_ptr, cutoff_ptr, vocab, stride_row, num_chunks, greedy_below,
    CHUNK: tl.constexpr, CHUNKS_PAD: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    active, temperature, shift, top, floor = _row_state(
        row, temperature_ptr, top_k_ptr, top_p_ptr, peak_ptr, min_p_ptr, greedy_below, LIBDEVICE
    )
    if active:
        key = tl.load(prefix_ptr + row)
        ordered = (key - 2147483648).to(tl.int32)
        bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
        mass = tl.exp(bits.to(tl.float32, bitcast=True).to(tl.float64) - top.to(tl.float64))
        # The tied tokens in id order: the j-th (from 0) has the mass above plus j times its own before it.
        room = tl.load(top_p_ptr + row).to(tl.float64) * tl.load(total_ptr + row) - tl.load(above_ptr + row)
        ties = tl.load(ties_ptr + row)
        wanted = tl.where(mass > 0.0, tl.minimum(room / mass, ties - 1.0), ties - 1.0)
        rank = tl.maximum(wanted, 0.0).to(tl.int32) + 1  # kept ties: at least the first
        c = tl.arange(0, CHUNKS_PAD)
        per_chunk = tl.load(tie_count_ptr + row * num_chunks + c, mask=c < num_chunks, other=0)
        through = tl.cumsum(per_chunk, axis=0)
        chunk = tl.min(tl.where(through >= rank, c, CHUNKS_PAD), axis=0)
        rank -= tl.sum(tl.where(c < chunk, per_chunk, 0), axis=0)
        ids = chunk * CHUNK + tl.arange(0, CHUNK)
        value, chunk_keys = _chunk_values(logits_ptr, row, stride_row, ids, vocab, temperature, shift, floor)
        tied = (value > float("-inf")) & (chunk_keys == key)
        last = tl.min(tl.where(tied & (tl.cumsum(tied.to(tl.int32), axis=0) == rank), ids, vocab), axis=0)
        tl.store(cutoff_ptr + row, (ordered.to(tl.int64) << 32) | (vocab - 1 - last).to(tl.int64))


def top_p_cutoffs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    peak: torch.Tensor,
    greedy_below: float,
    cutoff: torch.Tensor,
) -> None:
    """Write into `cutoff` [B] int64, for each random row of raw fp32 logits [B, V] asking top-p alone (top_k <= 0,
    top_p < 1), the order key of the last token top-p keeps of its processed logits (see the module's
    docstring); `peak` [B]: each row's largest logit. Other rows are not written. Allocates only by (B, V):
    capturable in a CUDA graph."""
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and cutoff.dtype == torch.int64
    if not rows:
        return
    device, num_chunks = logits.device, cdiv(vocab, CHUNK)
    chunks_pad = triton.next_power_of_2(num_chunks)
    prefix = torch.zeros(rows, dtype=torch.int64, device=device)
    above = torch.empty(rows, dtype=torch.float64, device=device)
    total = torch.empty(rows, dtype=torch.float64, device=device)
    ties = torch.empty(rows, dtype=torch.int32, device=device)
    mass = torch.empty(rows, num_chunks, DIGITS, dtype=torch.float64, device=device)
    count = torch.empty(rows, num_chunks, DIGITS, dtype=torch.int32, device=device)
    tie_count = torch.empty(rows, num_chunks, dtype=torch.int32, device=device)
    params = (temperature, top_k, top_p, peak, min_p)
    libdevice = not TRITON_INTERPRET
    for level in range(LEVELS):
        _digit_pass_kernel[(num_chunks, rows)](
            logits, *params, prefix, mass, count, vocab, logits.stride(0), num_chunks, greedy_below, level,
            CHUNK=CHUNK, DIGIT_BITS=DIGIT_BITS, DIGITS=DIGITS, LIBDEVICE=libdevice,
        )  # fmt: skip
        _digit_choice_kernel[(rows,)](
            *params, prefix, above, total, ties, mass, count, num_chunks, greedy_below, level,
            CHUNKS_PAD=chunks_pad, DIGITS=DIGITS, LIBDEVICE=libdevice,
        )  # fmt: skip
    _tie_count_kernel[(num_chunks, rows)](
        logits, *params, prefix, tie_count, vocab, logits.stride(0), num_chunks, greedy_below,
        CHUNK=CHUNK, LIBDEVICE=libdevice,
    )  # fmt: skip
    _cutoff_kernel[(rows,)](
        logits, *params, prefix, above, total, ties, tie_count, cutoff, vocab, logits.stride(0),
        num_chunks, greedy_below, CHUNK=CHUNK, CHUNKS_PAD=chunks_pad, LIBDEVICE=libdevice,
    )  # fmt: skip
