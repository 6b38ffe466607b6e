"""Sampling from each row's top-k candidates (sampler.sample_selected): a random row asking for top-k (<= the
variant's cap) can only sample among its k largest processed logits, so the Gumbel noise, the min-p floor and
top-p are needed for those k tokens alone, not for the whole vocabulary.

Stage 1, one program per (chunk of the vocabulary, row): the maximum of every BLOCK raw logits (NaN where the
block holds one). Stage 2, one program per row: the row's peak (its largest logit), then the exact top-k of its
processed values (scaled by temperature, the shift of sampler._scaling applied) by the logprobs' selection
(ops/logprob_reduce.py: block maxima, then counting; scaling is monotonic, so the scaled block maxima are the
raw ones scaled); then, over those k sorted candidates, min-p's floor, top-p's prefix (probabilities summed in
float64, as ops/kept_prefix.py does over a sorted row), each kept token's noise (ops/gumbel_sample.py's hash)
and the largest noisy value, ties to the lower id. Greedy rows take their top-1 of the raw logits (a row
holding a NaN: its first NaN's id, as torch.argmax).

Each row also gets the order key of its last kept token (what sampler.filter_cutoffs computes by a sort) and
`done`: whether its token is final. It is not for random rows without top-k, nor for rows whose processed
logits must be written for their logprobs: the full Gumbel pass (gumbel_sample with `done`) samples those,
the same token where it recomputes one; the rows among them asking top-p alone are flagged for the rounds of
ops/top_p_sample.py after it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import TRITON_INTERPRET, cdiv
from qwen3_runtime.ops.greedy import largest_first
from qwen3_runtime.ops.gumbel_sample import gumbel_from_bits, row_key, scaling_terms, token_bits
from qwen3_runtime.ops.logprob_reduce import order_key, top_k_sorted

CHUNK, BLOCK, GROUP = 4096, 128, 32
KEY_MIN = tl.constexpr(-(2**63))  # the cutoff that keeps every token (rows without top-k)


@triton.jit
def _block_max_kernel(logits_ptr, block_max_ptr, vocab, stride_row, n_blocks,
                      BLOCK: tl.constexpr, BLOCKS_PER_CHUNK: tl.constexpr):  # fmt: skip
    row = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(0) * BLOCKS_PER_CHUNK + tl.arange(0, BLOCKS_PER_CHUNK)
    ids = blk[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(logits_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    has_nan = tl.max((x != x).to(tl.int32), axis=1) > 0
    block_max = tl.where(has_nan, float("nan"), tl.max(tl.where(x != x, float("-inf"), x), axis=1))
    tl.store(block_max_ptr + row * n_blocks + blk, block_max, mask=blk < n_blocks)


@triton.jit
def _candidates_kernel(
    logits_ptr, block_max_ptr, scratch_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr,
    position_ptr, write_ptr, peak_ptr, token_ptr, cutoff_ptr, done_ptr, top_p_rows_ptr,
    vocab, stride_row, n_blocks, greedy_below,
    NOISE_BITS: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, GROUPS_PAD: tl.constexpr,
    K_PAD: tl.constexpr, C: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    blk = tl.arange(0, GROUPS_PAD)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    real = blk < n_blocks
    block_max = tl.load(block_max_ptr + row * n_blocks + blk, mask=real, other=float("-inf"))
    is_nan = block_max != block_max
    nan_block = tl.min(tl.min(tl.where(is_nan, blk, n_blocks), axis=1), axis=0)
    peak = tl.max(tl.max(tl.where(is_nan, float("-inf"), block_max), axis=1), axis=0)
    peak = tl.where(nan_block < n_blocks, float("nan"), peak)

    temperature = tl.load(temperature_ptr + row)
    is_random = temperature >= greedy_below
    top_k = tl.load(top_k_ptr + row)
    cutoff = tl.full([], KEY_MIN, tl.int64)
    token = tl.full([], 0, tl.int32)  # in range whatever happens: the next step may read it as its input
    if nan_block < n_blocks:
        ids = nan_block * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + ids, mask=ids < vocab, other=0.0)
        token = tl.min(tl.where(x != x, ids, vocab), axis=0)
    elif (peak > float("-inf")) & (~is_random | (top_k > 0)):
        temperature = tl.where(is_random, temperature, 1.0)  # greedy rows: the raw logits, never shifted
        shift, floor = scaling_terms(peak, temperature, tl.load(min_p_ptr + row), LIBDEVICE)
        k = tl.where(is_random, tl.minimum(top_k, K_PAD), 1)
        scaled_max = tl.math.div_rn(block_max - shift, temperature)
        value, ids = top_k_sorted(scaled_max, blk, real, row_ptr, scratch_ptr + row * 4 * C, k, vocab, shift,
                                  temperature, BLOCK, GROUPS_PAD, GROUP, K_PAD, C, True)  # fmt: skip
        token = tl.max(tl.where(tl.arange(0, K_PAD) == 0, ids, -1), axis=0)
        if is_random:
            value = tl.where(value < floor, float("-inf"), value)
            e = tl.exp(value.to(tl.float64) - tl.max(value, axis=0).to(tl.float64))  # 0 past k and below min-p
            total = tl.sum(e, axis=0)
            mass_before = (tl.cumsum(e, axis=0) - e) / total
            top_p = tl.load(top_p_ptr + row).to(tl.float64)
            kept = (value > float("-inf")) & (mass_before <= tl.where(top_p < 1.0, top_p, float("inf")))
            key = row_key(tl.load(seed_ptr + row), tl.load(position_ptr + row))
            noise = gumbel_from_bits(token_bits(key, ids) >> (32 - NOISE_BITS), NOISE_BITS, LIBDEVICE)
            _, drawn = largest_first(tl.where(kept, value + noise, float("-inf")), tl.where(kept, ids, vocab), vocab)
            token = tl.where(drawn < vocab, drawn, token)  # none kept (a row of +inf, failed by its status)
            last = tl.sum(kept.to(tl.int32), axis=0) - 1
            at_last = tl.arange(0, K_PAD) == last
            last_value = tl.max(tl.where(at_last, value, float("-inf")), axis=0)
            cutoff = order_key(last_value, tl.max(tl.where(at_last, ids, -1), axis=0))
    writes = tl.load(write_ptr + row) != 0
    done = ~is_random | ((top_k > 0) & ~writes)
    top_p_alone = is_random & (top_k <= 0) & (tl.load(top_p_ptr + row) < 1.0) & ~writes
    tl.store(top_p_rows_ptr + row, (top_p_alone & (tl.abs(peak) < float("inf"))).to(tl.int8))
    tl.store(peak_ptr + row, peak)
    tl.store(token_ptr + row, token.to(tl.int64))
    tl.store(cutoff_ptr + row, cutoff)
    tl.store(done_ptr + row, done.to(tl.int8))


def top_k_candidates(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    write_rows: torch.Tensor,
    greedy_below: float,
    noise_bits: int,
    cap: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(peak [B] f32, token [B] int64, cutoff [B] int64, done [B] bool, top_p_rows [B] int8) per row of raw fp32
    logits [B, V] whose random rows ask 0 < top_k <= cap or no top-k at all (see the module's docstring);
    top_p_rows flags the random rows asking top-p alone whose processed logits are not written and whose peak is
    finite, which ops/top_p_sample.py samples after the full pass. Allocates only by (B, V, cap): capturable in a
    CUDA graph."""
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and cap >= 1
    n_blocks = cdiv(vocab, BLOCK)
    k_pad = triton.next_power_of_2(cap)
    candidates = max(16, k_pad)  # compacted per phase before the exact fallback of rounds of max
    device = logits.device
    block_max = torch.empty(rows, n_blocks, dtype=torch.float32, device=device)
    scratch = torch.empty(rows, 4 * candidates, dtype=torch.int32, device=device)
    peak = torch.empty(rows, dtype=torch.float32, device=device)
    token = torch.empty(rows, dtype=torch.int64, device=device)
    cutoff = torch.empty(rows, dtype=torch.int64, device=device)
    done = torch.empty(rows, dtype=torch.int8, device=device)
    top_p_rows = torch.empty(rows, dtype=torch.int8, device=device)
    if rows:
        _block_max_kernel[(cdiv(vocab, CHUNK), rows)](
            logits, block_max, vocab, logits.stride(0), n_blocks, BLOCK=BLOCK, BLOCKS_PER_CHUNK=CHUNK // BLOCK,
            num_warps=4,
        )  # fmt: skip
        _candidates_kernel[(rows,)](
            logits, block_max, scratch, temperature, top_k, top_p, min_p, seed, position, write_rows, peak,
            token, cutoff, done, top_p_rows, vocab, logits.stride(0), n_blocks, greedy_below,
            NOISE_BITS=noise_bits, BLOCK=BLOCK, GROUP=GROUP,
            GROUPS_PAD=triton.next_power_of_2(cdiv(n_blocks, GROUP)), K_PAD=k_pad, C=candidates,
            LIBDEVICE=not TRITON_INTERPRET, num_warps=16,
        )  # fmt: skip
    return peak, token, cutoff, done.view(torch.bool), top_p_rows
