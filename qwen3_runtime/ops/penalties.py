"""Repetition, frequency and presence penalties and min_tokens' stop suppression (vLLM V1's semantics) in one
pass over a batch's fp32 logits, reading each penalized row's token history from device state indexed by its
penalty slot: no token list is uploaded per step, and the [slots, V] state is read only for rows that hold a
slot.

One program per (row, chunk of the vocabulary). A row with slot < 0 is copied unchanged; a row flagged in
`write_rows` also gets its penalized values written back over its logits (its processed logprobs are taken from
them), so no second [B, V] pass picks raw or penalized rows. For the others, in
vLLM's order: tokens seen in the prompt or the output get logit / r when positive, logit * r otherwise; then
logit -= frequency * count and -= presence * (count > 0) over the output's counts; then, while the row's
suppress flag is set, its stop ids (-1 padded) get -inf. The division rounds to nearest (tl.div_rn), as
PyTorch's does, so kernel and reference agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import use_triton

CHUNK = 2048


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
    write_ptr,
    vocab,
    stride_logits,
    stride_out,
    stride_counts,
    stride_prompt,
    stride_stop,
    num_stop,
    BLOCK_STOP: tl.constexpr,
    CHUNK: tl.constexpr,
    WRITE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    in_vocab = ids < vocab
    x = tl.load(logits_ptr + row * stride_logits + ids, mask=in_vocab)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    held = slot >= 0
    state = in_vocab & (ids * 0 + slot >= 0)  # a block mask: the interpreter takes no scalar in it
    count = tl.load(counts_ptr + slot * stride_counts + ids, mask=state, other=0)
    in_prompt = tl.load(prompt_mask_ptr + slot * stride_prompt + ids, mask=state, other=0) != 0
    r = tl.load(repetition_ptr + row)
    repeated = tl.where(x > 0, tl.div_rn(x, r), x * r)
    y = tl.where(in_prompt | (count > 0), repeated, x)
    y = y - tl.load(frequency_ptr + row) * count.to(tl.float32)
    y = y - tl.load(presence_ptr + row) * (count > 0).to(tl.float32)
    if tl.load(suppress_ptr + row) != 0:  # min_tokens not yet reached: the only rows that compare stop ids
        stop_cols = tl.arange(0, BLOCK_STOP)
        stops = tl.load(
            stop_ids_ptr + slot * stride_stop + stop_cols,
            mask=(stop_cols < num_stop) & (stop_cols * 0 + slot >= 0),
            other=-1,
        )
        is_stop = tl.max((ids[:, None] == stops[None, :]).to(tl.int32), axis=1) != 0
        y = tl.where(is_stop, float("-inf"), y)
    y = tl.where(held, y, x)
    tl.store(out_ptr + row * stride_out + ids, y, mask=in_vocab)
    if WRITE:
        if tl.load(write_ptr + row) != 0:
            tl.store(logits_ptr + row * stride_logits + ids, y, mask=in_vocab)


def apply_penalties(
    logits: torch.Tensor,
    slot: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
    suppress_stop: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    stop_ids: torch.Tensor,
    out: torch.Tensor | None = None,
    write_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The penalized copy of fp32 `logits` [B, V]. Per row ([B] each): `slot` (int, < 0: no penalties) into
    `output_counts` (int32 [S, V]), `prompt_mask` (uint8 [S, V], nonzero: in the prompt) and `stop_ids` (int32
    [S, N], -1 padded); presence, frequency and repetition (f32); suppress_stop (int, nonzero: the stop ids are
    -inf). Written into `out` when given (the kernel path), else a new tensor; rows with write_rows [B] != 0 (int)
    are also written over `logits`. Allocates only by (B, V): capturable in a CUDA graph."""
    if not use_triton(logits):
        penalized = apply_penalties_reference(
            logits, slot, presence, frequency, repetition, suppress_stop, output_counts, prompt_mask, stop_ids
        )
        if write_rows is not None:
            logits.copy_(torch.where((write_rows != 0)[:, None], penalized, logits))
        return penalized
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    assert output_counts.dtype == stop_ids.dtype == torch.int32 and prompt_mask.dtype == torch.uint8
    assert output_counts.stride(1) == prompt_mask.stride(1) == stop_ids.stride(1) == 1
    out = torch.empty_like(logits) if out is None else out
    if rows:
        _penalties_kernel[(rows, triton.cdiv(vocab, CHUNK))](
            logits,
            out,
            slot,
            presence,
            frequency,
            repetition,
            suppress_stop,
            output_counts,
            prompt_mask,
            stop_ids,
            slot if write_rows is None else write_rows,  # unread without WRITE
            vocab,
            logits.stride(0),
            out.stride(0),
            output_counts.stride(0),
            prompt_mask.stride(0),
            stop_ids.stride(0),
            stop_ids.shape[1],
            BLOCK_STOP=triton.next_power_of_2(stop_ids.shape[1]),
            CHUNK=CHUNK,
            WRITE=write_rows is not None,
            num_warps=4,
        )
    return out


def apply_penalties_reference(
    logits: torch.Tensor,
    slot: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
    suppress_stop: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    stop_ids: torch.Tensor,
) -> torch.Tensor:
    """`apply_penalties` in PyTorch: each row's state gathered into [B, V] tensors."""
    held = (slot >= 0)[:, None]
    rows = slot.long().clamp_min(0)
    counts = output_counts[rows].float()
    seen = (prompt_mask[rows] != 0) | (counts > 0)
    r = repetition[:, None]
    y = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    y = y - frequency[:, None] * counts
    y = y - presence[:, None] * (counts > 0).float()
    stops = stop_ids[rows].long()
    vocab = logits.shape[1]
    is_stop = torch.zeros(len(slot), vocab + 1, dtype=torch.bool, device=logits.device)
    is_stop.scatter_(1, torch.where(stops < 0, vocab, stops), True)  # -1 padding lands in the extra column
    y = y.masked_fill(is_stop[:, :vocab] & (suppress_stop != 0)[:, None], float("-inf"))
    return torch.where(held, y, logits)
