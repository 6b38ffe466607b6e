"""Structured outputs' token mask applied to a step's fp32 logits in place: where a row's bit for a token is 0, the
logit becomes -inf, so neither the sampler nor processed logprobs see it. It works in place: raw logprobs (the
model's distribution) are to be taken from the logits before it runs.

The bitmask is int32 [mask_rows, ceil(V/32)] as xgrammar fills it (bit t % 32 of word t // 32: token t allowed;
bits past V are ignored). `mask_row[b]` says which bitmask row logits row b takes, < 0 for none: constrained rows
can be packed at the top of the bitmask, so the host copies only those. One program per (row, chunk of the
vocabulary); a row without a mask exits at once, and a masked row only writes -inf (it reads the bitmask, not the
logits). Static grid, no host sync, no allocation: capturable in a CUDA graph.

A row whose bits are all 0 comes out all -inf: the sampler's largest logit is then -inf, which flags the row as
not finite (status 1) and fails that request alone; the engine sends such a row only for a grammar that has
already ended (structured/matcher.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import use_triton

CHUNK = 4096  # tokens a program: 128 words of a bitmask row


@triton.jit
def _grammar_mask_kernel(
    logits_ptr, bitmask_ptr, mask_row_ptr, vocab, stride_logits, stride_bitmask, CHUNK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    source = tl.load(mask_row_ptr + row).to(tl.int64)
    if source < 0:
        return
    words = tl.program_id(1) * (CHUNK // 32) + tl.arange(0, CHUNK // 32)  # this chunk's words of the bitmask row
    bits = tl.arange(0, 32)
    ids = words[:, None] * 32 + bits[None, :]  # [CHUNK // 32, 32]: the chunk's tokens in order
    word = tl.load(bitmask_ptr + source * stride_bitmask + words, mask=words * 32 < vocab, other=-1)
    banned = ((word[:, None] >> bits[None, :]) & 1) == 0  # arithmetic shift: bit 31 reads right too
    minus_inf = tl.full([CHUNK // 32, 32], float("-inf"), tl.float32)
    tl.store(logits_ptr + row * stride_logits + ids, minus_inf, mask=(ids < vocab) & banned)


def apply_grammar_mask(logits: torch.Tensor, bitmask: torch.Tensor, mask_row: torch.Tensor) -> None:
    """In place on fp32 `logits` [B, V]: logits[b, t] = -inf where bit t of bitmask[mask_row[b]] is 0, for each b
    with mask_row[b] >= 0 (int [B]); bitmask int32 [*, >= ceil(V/32)]."""
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and bitmask.dtype == torch.int32 and mask_row.shape == (rows,)
    assert bitmask.shape[1] * 32 >= vocab and logits.stride(1) == 1 and bitmask.stride(1) == 1
    if not use_triton(logits):
        return apply_grammar_mask_reference(logits, bitmask, mask_row)
    if rows:
        _grammar_mask_kernel[(rows, triton.cdiv(vocab, CHUNK))](
            logits, bitmask, mask_row, vocab, logits.stride(0), bitmask.stride(0), CHUNK=CHUNK, num_warps=4
        )


def apply_grammar_mask_reference(logits: torch.Tensor, bitmask: torch.Tensor, mask_row: torch.Tensor) -> None:
    """`apply_grammar_mask` in PyTorch: each row's bits unpacked to [B, V] booleans."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    words = bitmask[mask_row.long().clamp_min(0)]
    allowed = ((words[:, :, None] >> shifts) & 1).flatten(1)[:, :vocab] != 0
    logits.masked_fill_(~allowed & (mask_row >= 0)[:, None], float("-inf"))
