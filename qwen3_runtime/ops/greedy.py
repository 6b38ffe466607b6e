"""Greedy decoding's row maximum and its token: `logits.max(dim=-1)` in two Triton kernels launched with
programmatic dependent launch: faster than PyTorch's reduction over ~0.6 MB of logits a row, and with
no gap after the lm_head as a plain launch would leave.

Stage 1, one program per (row, chunk of the vocabulary): the chunk's largest value and its lowest id
(NaN above everything, as torch.argmax). Stage 2 (row_max_kernel, which ops/gumbel_sample.py shares), one
program per row: the same over the chunks, in order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import pdl_launch, use_triton

CHUNK = 4096


@triton.jit
def largest_first(x, ids, none):
    """The largest of x and the lowest of `ids` where it sits (`none` if nowhere), as torch.argmax picks it:
    NaN counts above everything, so a row holding a NaN gives NaN and its first NaN's id."""
    is_nan = x != x
    first_nan = tl.min(tl.where(is_nan, ids, none), axis=0)
    best = tl.max(tl.where(is_nan, float("-inf"), x), axis=0)
    first = tl.min(tl.where(x == best, ids, none), axis=0)
    return tl.where(first_nan != none, float("nan"), best), tl.where(first_nan != none, first_nan, first)


@triton.jit
def _chunk_max_kernel(
    logits_ptr, chunk_max_ptr, chunk_id_ptr, vocab, stride_row, num_chunks, CHUNK: tl.constexpr, USE_PDL: tl.constexpr
):
    if USE_PDL:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    peak, first = largest_first(x, ids, vocab)
    tl.store(chunk_max_ptr + row * num_chunks + chunk, peak)
    tl.store(chunk_id_ptr + row * num_chunks + chunk, first)
    if USE_PDL:
        gdc_launch_dependents()


@triton.jit
def row_max_kernel(
    chunk_max_ptr,
    chunk_id_ptr,
    peak_ptr,
    token_ptr,
    done_ptr,
    num_chunks,
    vocab,
    BLOCK_CHUNKS: tl.constexpr,
    HAS_DONE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    if HAS_DONE:  # rows sampled elsewhere keep their token
        if tl.load(done_ptr + row) != 0:
            return
    chunks = tl.arange(0, BLOCK_CHUNKS)
    mask = chunks < num_chunks
    m = tl.load(chunk_max_ptr + row * num_chunks + chunks, mask=mask, other=float("-inf"))
    ids = tl.load(chunk_id_ptr + row * num_chunks + chunks, mask=mask, other=vocab)
    peak, first = largest_first(m, ids, vocab)  # chunks in id order: the lowest id overall
    tl.store(peak_ptr + row, peak)
    tl.store(token_ptr + row, first.to(tl.int64))
    if USE_PDL:
        gdc_launch_dependents()


def greedy_max(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(largest logit [B] f32, its token id [B] int64) per row of fp32 logits [B, V]; ties go to the
    lower id, and a row holding a NaN has the peak NaN and its first NaN's token."""
    if not use_triton(logits):
        return greedy_max_reference(logits)
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    num_chunks, chunk_max, chunk_id = chunk_buffers(rows, vocab, CHUNK, logits.device)
    if rows:
        _chunk_max_kernel[(rows, num_chunks)](
            logits,
            chunk_max,
            chunk_id,
            vocab,
            logits.stride(0),
            num_chunks,
            CHUNK=CHUNK,
            num_warps=8,
            **pdl_launch(logits),
        )
    return reduce_chunks(chunk_max, chunk_id, vocab)


def chunk_buffers(rows: int, vocab: int, chunk: int, device: torch.device) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Stage 1's output, for reduce_chunks: (chunks a row splits into, their maxima [B, chunks] f32, their ids
    [B, chunks] int32). Shared with gumbel_sample, whose stage 1 differs but whose stage 2 is this module's."""
    num_chunks = triton.cdiv(vocab, chunk)
    chunk_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=device)
    return num_chunks, chunk_max, torch.empty(rows, num_chunks, dtype=torch.int32, device=device)


def reduce_chunks(
    chunk_max: torch.Tensor,
    chunk_id: torch.Tensor,
    vocab: int,
    done: torch.Tensor | None = None,
    token: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2 (row_max_kernel): each row's (largest value [B] f32, its token id [B] int64) from its chunks'
    maxima and ids [B, num_chunks], chunks in id order; into `token` when given, skipping rows `done`."""
    rows, num_chunks = chunk_max.shape
    peak = torch.empty(rows, dtype=torch.float32, device=chunk_max.device)
    token = torch.empty(rows, dtype=torch.int64, device=chunk_max.device) if token is None else token
    if rows:
        row_max_kernel[(rows,)](
            chunk_max,
            chunk_id,
            peak,
            token,
            peak if done is None else done,  # unread without HAS_DONE
            num_chunks,
            vocab,
            BLOCK_CHUNKS=triton.next_power_of_2(num_chunks),
            HAS_DONE=done is not None,
            num_warps=1,
            **pdl_launch(chunk_max),
        )
    return peak, token


def greedy_max_reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return logits.max(dim=-1)
