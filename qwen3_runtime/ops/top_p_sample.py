"""Top-p without a sort (sampler.sample_selected), for random rows asking top-p and no top-k: the kept tokens are a
prefix of the stable descending order of the processed values, and the sampled token is the noisy argmax over that
prefix. The full Gumbel pass has drawn each row's argmax over all its tokens (min-p applied) and stored every
token's noisy value (processed + noise). Then rounds of one pass over the row: the mass ranked before the candidate
says whether top-p keeps it (the mass before it, over the total, <= top_p, as ops/kept_prefix.py counts it); if
not, the candidate becomes the noisy argmax among the tokens ranked before it. The first SPREAD_ROUNDS rounds run
over the whole GPU (a program per chunk of a row, partial sums combined by a program per row, which decides); a row
still undecided after them, rare, finishes its rounds in that one program.

Why it is exact: a rejected candidate lies outside the kept prefix, so the tokens ranked before it still hold the
whole prefix, and the argmax over a set holding the prefix, when it lies in the prefix, is the argmax over the
prefix (ties to the lower id both ways). Each round drops at least the candidate, so it ends; a candidate is drawn
in proportion to its probability, so most rows take one round.

The masses are summed from float32 exponentials, whose rounding is far below MARGIN; a candidate whose fraction
lies within MARGIN of top_p is decided again from float64 exponentials, as the sort's reference sums them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import TRITON_INTERPRET
from qwen3_runtime.ops.greedy import largest_first
from qwen3_runtime.ops.gumbel_sample import processed_value, scaling_terms

BLOCK = 4096  # a row's tokens a step of the one-program rounds
NUM_WARPS = 16
CHUNK = 2048  # a row's tokens a program of the spread rounds: many programs even for one row
# Spread rounds for the rounds nearly every row needs; a rare later one runs in one program per row. A spread round
# costs two launches even when no row is left; a round in one program per row reads the row through one SM.
SPREAD_ROUNDS = 3
MARGIN = 1e-4  # far above float32's rounding of the sums (a relative ~1e-5 at Qwen3's vocabulary)


@triton.jit
def _row_terms(logits_ptr, temperature_ptr, peak_ptr, min_p_ptr, token_ptr, row, stride_row, LIBDEVICE: tl.constexpr):
    """A row's processing terms (scaling_terms), its largest processed value, and its candidate with its value."""
    temperature = tl.load(temperature_ptr + row)
    peak = tl.load(peak_ptr + row)
    shift, floor = scaling_terms(peak, temperature, tl.load(min_p_ptr + row), LIBDEVICE)
    token = tl.load(token_ptr + row).to(tl.int32)
    value_c = processed_value(tl.load(logits_ptr + row * stride_row + token), shift, temperature, floor)
    return shift, floor, temperature, tl.math.div_rn(peak - shift, temperature), token, value_c


@triton.jit
def _round(row_ptr, noisy_row_ptr, value_c, token, shift, temperature, floor, peak_value, lo, hi, vocab,
           BLOCK: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """One pass over tokens [lo, hi) of a row: (the mass ranked before token `token` of processed value `value_c`,
    the mass, the largest noisy value among the tokens ranked before it and its id), the masses relative to
    exp(peak_value), in float64 exponentials if EXACT. Lane-wise accumulators: no reduction until the end."""
    dtype = tl.float64 if EXACT else tl.float32
    before = tl.zeros([BLOCK], dtype)
    total = tl.zeros([BLOCK], dtype)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_id = tl.full([BLOCK], 0, tl.int32) + vocab
    for start in range(lo, hi, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + ids, mask=ids < vocab, other=float("-inf"))
        noisy = tl.load(noisy_row_ptr + ids, mask=ids < vocab, other=float("-inf"))
        value = processed_value(x, shift, temperature, floor)  # -inf past the vocabulary
        e = tl.exp(value.to(dtype) - peak_value.to(dtype))
        # The stable descending order (ops/logprob_reduce.order_key's): -0.0 equals 0.0 here as there.
        ahead = (value > value_c) | ((value == value_c) & (ids < token))
        total += e
        before += tl.where(ahead, e, 0.0)
        better = ahead & (noisy > best)  # a lane's ids rise from block to block: a tie keeps the lower one
        best = tl.where(better, noisy, best)
        best_id = tl.where(better, ids, best_id)
    largest, ahead_argmax = largest_first(best, best_id, vocab)
    return tl.sum(before.to(tl.float64), axis=0), tl.sum(total.to(tl.float64), axis=0), largest, ahead_argmax


@triton.jit
def _spread_round_kernel(
    logits_ptr, noisy_ptr, pending_ptr, temperature_ptr, peak_ptr, min_p_ptr, token_ptr,
    before_ptr, total_ptr, best_ptr, best_id_ptr, vocab, stride_row, num_chunks,
    CHUNK: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    """Program (row, chunk): a round over one chunk of an undecided row, as partial sums and a partial argmax."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(pending_ptr + row) == 0:
        return
    chunk = tl.program_id(1)
    shift, floor, temperature, peak_value, token, value_c = _row_terms(
        logits_ptr, temperature_ptr, peak_ptr, min_p_ptr, token_ptr, row, stride_row, LIBDEVICE
    )
    lo, row_ptr, noisy_row_ptr = chunk * CHUNK, logits_ptr + row * stride_row, noisy_ptr + row * vocab
    before, total, best, best_id = _round(row_ptr, noisy_row_ptr, value_c, token, shift, temperature, floor,
                                          peak_value, lo, lo + CHUNK, vocab, CHUNK, False)  # fmt: skip
    at = row * num_chunks + chunk
    tl.store(before_ptr + at, before)
    tl.store(total_ptr + at, total)
    tl.store(best_ptr + at, best)
    tl.store(best_id_ptr + at, best_id)


@triton.jit
def _decide_kernel(
    logits_ptr, noisy_ptr, pending_ptr, temperature_ptr, peak_ptr, min_p_ptr, top_p_ptr, token_ptr,
    before_ptr, total_ptr, best_ptr, best_id_ptr, vocab, stride_row, num_chunks, margin,
    BLOCK: tl.constexpr, BLOCK_CHUNKS: tl.constexpr, LIBDEVICE: tl.constexpr, FINISH: tl.constexpr,
):  # fmt: skip
    """Program per undecided row: the spread round's verdict from its chunks' partials. Kept: the row is decided.
    Rejected: the candidate becomes the noisy argmax ranked before it, for the next spread round to weigh, or, if
    FINISH, for the rounds this program runs over the row until one keeps its candidate."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(pending_ptr + row) == 0:
        return
    row_ptr = logits_ptr + row * stride_row
    noisy_row_ptr = noisy_ptr + row * vocab
    shift, floor, temperature, peak_value, token, value_c = _row_terms(
        logits_ptr, temperature_ptr, peak_ptr, min_p_ptr, token_ptr, row, stride_row, LIBDEVICE
    )
    top_p = tl.load(top_p_ptr + row).to(tl.float64)
    chunks = tl.arange(0, BLOCK_CHUNKS)
    at, in_row = row * num_chunks + chunks, chunks < num_chunks
    before = tl.sum(tl.load(before_ptr + at, mask=in_row, other=0.0), axis=0)
    total = tl.sum(tl.load(total_ptr + at, mask=in_row, other=0.0), axis=0)
    best = tl.load(best_ptr + at, mask=in_row, other=float("-inf"))
    _, ahead = largest_first(best, tl.load(best_id_ptr + at, mask=in_row, other=vocab), vocab)  # chunks in id order
    undecided = True
    while undecided:
        if tl.abs(before / total - top_p) <= margin:
            before, total, _, ahead = _round(row_ptr, noisy_row_ptr, value_c, token, shift, temperature, floor,
                                             peak_value, 0, vocab, vocab, BLOCK, True)  # fmt: skip
        if before / total <= top_p:
            undecided = False
            tl.store(pending_ptr + row, 0)
        else:
            token = ahead
            if FINISH:
                value_c = processed_value(tl.load(row_ptr + token), shift, temperature, floor)
                before, total, _, ahead = _round(row_ptr, noisy_row_ptr, value_c, token, shift, temperature,
                                                 floor, peak_value, 0, vocab, vocab, BLOCK, False)  # fmt: skip
            else:
                undecided = False
    tl.store(token_ptr + row, token.to(tl.int64))


def top_p_reject(
    logits: torch.Tensor,
    noisy: torch.Tensor,
    pending: torch.Tensor,
    temperature: torch.Tensor,
    peak: torch.Tensor,
    min_p: torch.Tensor,
    top_p: torch.Tensor,
    token: torch.Tensor,
    margin: float = MARGIN,
) -> None:
    """In place on `token` [B] int64 (each row's noisy argmax over all its tokens, min-p applied): rows with
    pending != 0 [B] get the noisy argmax over what top_p [B] f32 keeps (see the module's docstring). raw fp32
    logits [B, V], their processed values + noise `noisy` [B, V] (-inf below min-p), each row's largest logit
    `peak` [B] (finite on pending rows). Allocates only by (B, V): capturable in a CUDA graph."""
    rows, vocab = logits.shape
    assert logits.dtype == noisy.dtype == torch.float32 and logits.stride(1) == 1 and noisy.is_contiguous()
    assert noisy.shape == logits.shape and token.dtype == torch.int64
    if not rows:
        return
    num_chunks = triton.cdiv(vocab, CHUNK)
    undecided = pending.to(torch.int8, copy=True)  # cleared row by row as rounds keep their candidates
    sums = torch.empty(2, rows, num_chunks, dtype=torch.float64, device=logits.device)  # before, total
    best = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    best_id = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    row_args = (logits, noisy, undecided, temperature, peak, min_p)
    partials = (sums[0], sums[1], best, best_id, vocab, logits.stride(0), num_chunks)
    for spread_round in range(SPREAD_ROUNDS):
        _spread_round_kernel[(rows, num_chunks)](
            *row_args, token, *partials, CHUNK=CHUNK, LIBDEVICE=not TRITON_INTERPRET, num_warps=4
        )
        _decide_kernel[(rows,)](
            *row_args, top_p, token, *partials, margin, BLOCK=BLOCK, BLOCK_CHUNKS=triton.next_power_of_2(num_chunks),
            LIBDEVICE=not TRITON_INTERPRET, FINISH=spread_round == SPREAD_ROUNDS - 1, num_warps=NUM_WARPS,
        )  # fmt: skip


def top_p_reject_reference(
    processed: torch.Tensor, noisy: torch.Tensor, pending: torch.Tensor, top_p: torch.Tensor, token: torch.Tensor
) -> None:
    """top_p_reject in PyTorch, from the processed values [B, V] themselves (the CPU path has them): the same
    rounds, each a pass over the row, the masses summed from float64 exponentials as the sort's reference sums
    them, so no margin is needed. A row at a time, in two scratch rows."""
    vocab = processed.shape[-1]
    exps = torch.empty(vocab, dtype=torch.float64, device=processed.device)
    ahead = torch.empty(vocab, dtype=torch.float64, device=processed.device)  # 1 where ranked before the candidate
    for row in pending.nonzero()[:, 0].tolist():
        value, limit = processed[row], float(top_p[row])
        total = exps.copy_(value).sub_(value.max()).exp_().sum()
        candidate = int(token[row])
        while True:
            torch.gt(value, value[candidate], out=ahead)
            torch.ge(value[:candidate], value[candidate], out=ahead[:candidate])  # ties: the lower ids rank first
            if torch.dot(ahead, exps) / total <= limit:
                break
            candidate = int(noisy[row].masked_fill(ahead == 0, float("-inf")).argmax())
        token[row] = candidate
