"""Repetition, frequency and presence penalties, min_tokens' stop suppression and logit_bias (vLLM V1's
semantics) in one pass over a batch's fp32 logits, reading each penalized row's token history from device state
indexed by its penalty slot: no token list is uploaded per step, and the [slots, V] state is read only for rows
that hold a slot.

One program per (row, chunk of the vocabulary). A row with slot < 0 is copied unchanged; a row flagged in
`write_rows` also gets its penalized values written back over its logits (its processed logprobs are taken from
them), so no second [B, V] pass picks raw or penalized rows. For the others, in vLLM's order: a token's bias is
added; tokens seen in the prompt or the output get logit / r when positive, logit * r otherwise; then
logit -= frequency * count and -= presence * (count > 0) over the output's counts; then, while the row's
suppress flag is set, its stop ids (-1 padded) get -inf. The bias is sparse (a short list of tokens a slot): a
program stores its chunk unbiased, then computes the listed tokens that fall in its chunk again from their raw
logits plus the bias, and writes them over it. The division rounds to nearest (tl.div_rn) and no product is fused
into the subtraction after it (enable_fp_fusion=False), each rounded once as in PyTorch, so kernel and reference
agree bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import use_triton

CHUNK = 2048
BLOCK_BIAS = 128  # logit_bias entries a program compares with its chunk at a time


class PenaltyRows(NamedTuple):
    """A batch's per-row inputs ([B] each), in the kernel's argument order."""

    slot: torch.Tensor  # int: the row's penalty slot in SlotState, < 0 for none (the row is copied unchanged)
    presence: torch.Tensor  # f32
    frequency: torch.Tensor  # f32
    repetition: torch.Tensor  # f32
    suppress_stop: torch.Tensor  # int, nonzero: the slot's stop ids are -inf (min_tokens not reached)


class SlotState(NamedTuple):
    """The penalty slots' device state; a row reads its slot's."""

    output_counts: torch.Tensor  # int32 [S, V]: how often each token was sampled
    prompt_mask: torch.Tensor  # uint8 [S, V]: nonzero where the prompt has the token
    stop_ids: torch.Tensor  # int32 [S, N]: what min_tokens suppresses, -1 padded
    num_bias: torch.Tensor  # int32 [S]: how many logit_bias entries the slot has
    bias_ids: torch.Tensor  # int32 [S, M]: their token ids, the first num_bias of the row (distinct)
    bias_values: torch.Tensor  # float32 [S, M]: what they add


@triton.jit
def _penalized(x, count, in_prompt, repetition, frequency, presence):
    """vLLM's penalties on (biased) logits x, given each token's output count and whether the prompt has it."""
    repeated = tl.where(x > 0, tl.div_rn(x, repetition), x * repetition)
    y = tl.where(in_prompt | (count > 0), repeated, x)
    y = y - frequency * count.to(tl.float32)
    return y - presence * (count > 0).to(tl.float32)


@triton.jit
def _is_stop(ids, stop_ids, num_stop, BLOCK_STOP: tl.constexpr):
    """Whether each of `ids` is one of the slot's stop ids (`stop_ids`: its row of the table, -1 padded)."""
    stop_cols = tl.arange(0, BLOCK_STOP)
    stops = tl.load(stop_ids + stop_cols, mask=stop_cols < num_stop, other=-1)
    return tl.max((ids[:, None] == stops[None, :]).to(tl.int32), axis=1) != 0


@triton.jit
def _penalties_kernel(
    logits_ptr,
    out_ptr,
    slot_ptr,
    presence_ptr,
    frequency_ptr,
    repetition_ptr,
    suppress_ptr,
    counts_ptr,
    prompt_mask_ptr,
    stop_ids_ptr,
    num_bias_ptr,
    bias_ids_ptr,
    bias_values_ptr,
    write_ptr,
    vocab,
    stride_logits,
    stride_out,
    stride_counts,
    stride_prompt,
    stride_stop,
    stride_bias,
    num_stop,
    BLOCK_STOP: tl.constexpr,
    BLOCK_BIAS: tl.constexpr,
    CHUNK: tl.constexpr,
    WRITE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * CHUNK
    ids = start + tl.arange(0, CHUNK)
    in_vocab = ids < vocab
    x = tl.load(logits_ptr + row * stride_logits + ids, mask=in_vocab)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    held = slot >= 0
    state = in_vocab & (ids * 0 + slot >= 0)  # a block mask: the interpreter takes no scalar in it
    counts, prompt_mask = counts_ptr + slot * stride_counts, prompt_mask_ptr + slot * stride_prompt
    stop_ids = stop_ids_ptr + tl.maximum(slot, 0) * stride_stop  # only a held row's result is kept
    r, f, p = tl.load(repetition_ptr + row), tl.load(frequency_ptr + row), tl.load(presence_ptr + row)
    suppress = tl.load(suppress_ptr + row) != 0  # min_tokens not yet reached: the only rows that compare stop ids
    count = tl.load(counts + ids, mask=state, other=0)
    in_prompt = tl.load(prompt_mask + ids, mask=state, other=0) != 0
    y = _penalized(x, count, in_prompt, r, f, p)
    if suppress:
        y = tl.where(_is_stop(ids, stop_ids, num_stop, BLOCK_STOP), float("-inf"), y)
    y = tl.where(held, y, x)
    out = out_ptr + row * stride_out
    tl.store(out + ids, y, mask=in_vocab)
    num_bias = tl.where(held, tl.load(num_bias_ptr + tl.maximum(slot, 0)), 0)
    if num_bias > 0:  # this chunk's biased tokens again, from their raw logits plus the bias, over what was stored
        tl.debug_barrier()
        for first in range(0, num_bias, BLOCK_BIAS):
            cols = first + tl.arange(0, BLOCK_BIAS)
            token = tl.load(bias_ids_ptr + slot * stride_bias + cols, mask=cols < num_bias, other=-1)
            mine = (token >= start) & (token < start + CHUNK)
            xb = tl.load(logits_ptr + row * stride_logits + token, mask=mine)
            xb += tl.load(bias_values_ptr + slot * stride_bias + cols, mask=mine)
            cb = tl.load(counts + token, mask=mine, other=0)
            pb = tl.load(prompt_mask + token, mask=mine, other=0) != 0
            yb = _penalized(xb, cb, pb, r, f, p)
            if suppress:
                yb = tl.where(_is_stop(token, stop_ids, num_stop, BLOCK_STOP), float("-inf"), yb)
            tl.store(out + token, yb, mask=mine)
        tl.debug_barrier()
        y = tl.load(out + ids, mask=in_vocab)
    if WRITE:
        if tl.load(write_ptr + row) != 0:
            tl.store(logits_ptr + row * stride_logits + ids, y, mask=in_vocab)


def apply_penalties(
    logits: torch.Tensor,
    per_row: PenaltyRows,
    state: SlotState,
    out: torch.Tensor | None = None,
    write_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The penalized copy of fp32 `logits` [B, V], each row's slot read from `state`. Written into `out` when given
    (the kernel path), else a new tensor; rows with write_rows [B] != 0 (int) are also written over `logits`.
    Allocates only by (B, V): capturable in a CUDA graph."""
    if not use_triton(logits):
        penalized = apply_penalties_reference(logits, per_row, state)
        if write_rows is not None:
            logits.copy_(torch.where((write_rows != 0)[:, None], penalized, logits))
        return penalized
    rows, vocab = logits.shape
    counts, prompt_mask, stop_ids, num_bias, bias_ids, bias_values = state
    assert logits.dtype == bias_values.dtype == torch.float32 and logits.stride(1) == 1
    assert counts.dtype == stop_ids.dtype == num_bias.dtype == bias_ids.dtype == torch.int32
    assert prompt_mask.dtype == torch.uint8 and bias_ids.stride() == bias_values.stride()
    assert counts.stride(1) == prompt_mask.stride(1) == stop_ids.stride(1) == bias_ids.stride(1) == 1
    out = torch.empty_like(logits) if out is None else out
    if rows:
        _penalties_kernel[(rows, triton.cdiv(vocab, CHUNK))](
            logits,
            out,
            *per_row,
            counts,
            prompt_mask,
            stop_ids,
            num_bias,
            bias_ids,
            bias_values,
            per_row.slot if write_rows is None else write_rows,  # unread without WRITE
            vocab,
            logits.stride(0),
            out.stride(0),
            counts.stride(0),
            prompt_mask.stride(0),
            stop_ids.stride(0),
            bias_ids.stride(0),
            stop_ids.shape[1],
            BLOCK_STOP=triton.next_power_of_2(stop_ids.shape[1]),
            BLOCK_BIAS=BLOCK_BIAS,
            CHUNK=CHUNK,
            WRITE=write_rows is not None,
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out


def apply_penalties_reference(logits: torch.Tensor, per_row: PenaltyRows, state: SlotState) -> torch.Tensor:
    """`apply_penalties` in PyTorch: each row's state gathered into [B, V] tensors."""
    slot, presence, frequency, repetition, suppress_stop = per_row
    held = (slot >= 0)[:, None]
    rows = slot.long().clamp_min(0)
    vocab = logits.shape[1]

    def spread(ids: torch.Tensor, values: torch.Tensor | bool, dtype: torch.dtype) -> torch.Tensor:
        """[B, V] with values at ids (a -1 id lands in an extra column, dropped)."""
        dense = torch.zeros(len(slot), vocab + 1, dtype=dtype, device=logits.device)
        return dense.scatter_(1, torch.where(ids < 0, vocab, ids), values)[:, :vocab]

    entries = torch.arange(state.bias_ids.shape[1], device=logits.device) < state.num_bias[rows][:, None]
    bias_ids = torch.where(entries, state.bias_ids[rows].long(), -1)
    biased = spread(bias_ids, True, torch.bool)
    x = torch.where(biased, logits + spread(bias_ids, state.bias_values[rows], torch.float32), logits)
    counts = state.output_counts[rows].float()
    seen = (state.prompt_mask[rows] != 0) | (counts > 0)
    r = repetition[:, None]
    y = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    y = y - frequency[:, None] * counts
    y = y - presence[:, None] * (counts > 0).float()
    is_stop = spread(state.stop_ids[rows].long(), True, torch.bool)
    y = y.masked_fill(is_stop & (suppress_stop != 0)[:, None], float("-inf"))
    return torch.where(held, y, logits)
