"""`pack`: a step's sampled ids and logprob results written into its packed rows on the device (the layout and
the host's views of the rows: packed_rows.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwen3_runtime.logprobs.reduce import LogprobBuffers
from qwen3_runtime.ops import use_triton
from qwen3_runtime.packed_rows import HEADER


def pack(tokens: torch.Tensor, logprobs: LogprobBuffers, out: torch.Tensor, peak: torch.Tensor | None = None) -> None:
    """Write one step's results into `out` [rows, packed_width] int32. The status column is the
    reduction's (prompt logprobs: every row reduced) or, given `peak`, each row's largest logit, 1 where
    it is not finite (NaN, +inf, or -inf when every logit is): a decode step reduces only the rows that
    asked. One kernel on the GPU, where PyTorch copies and the finiteness test would take a dozen
    launches at the end of every decode step."""
    if not use_triton(out):
        return pack_reference(tokens, logprobs, out, peak)
    rows, k = out.shape[0], logprobs.k_max
    assert out.stride(1) == 1 and logprobs.top_ids.stride() == logprobs.top_logprobs.stride()
    if rows:
        from_peak = peak is not None
        _pack_kernel[(rows,)](
            tokens,
            peak if from_peak else logprobs.status,
            logprobs.logprob,
            logprobs.rank,
            logprobs.logsumexp,
            logprobs.top_ids,
            logprobs.top_logprobs,
            out,
            k,
            out.stride(0),
            logprobs.top_ids.stride(0),
            HEADER=HEADER,
            BLOCK_K=triton.next_power_of_2(max(k, 1)),
            STATUS_FROM_PEAK=from_peak,
            num_warps=1,
        )


@triton.jit
def _pack_kernel(
    tokens_ptr,
    status_ptr,
    logprob_ptr,
    rank_ptr,
    logsumexp_ptr,
    top_ids_ptr,
    top_logprobs_ptr,
    out_ptr,
    k_max,
    stride_out,
    stride_top,
    HEADER: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STATUS_FROM_PEAK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    out = out_ptr + row * stride_out
    status = tl.load(status_ptr + row)
    if STATUS_FROM_PEAK:  # a row's largest logit is finite unless some logit is NaN or +inf, or all are -inf
        status = ((status != status) | (tl.abs(status) == float("inf"))).to(tl.int32)
    tl.store(out, tl.load(tokens_ptr + row).to(tl.int32))
    tl.store(out + 1, status.to(tl.int32))
    tl.store(out + 2, tl.load(logprob_ptr + row).to(tl.int32, bitcast=True))
    tl.store(out + 3, tl.load(rank_ptr + row))
    tl.store(out + 4, tl.load(logsumexp_ptr + row).to(tl.int32, bitcast=True))
    cols = tl.arange(0, BLOCK_K)
    mask = cols < k_max
    tl.store(out + HEADER + cols, tl.load(top_ids_ptr + row * stride_top + cols, mask=mask), mask=mask)
    top_logprobs = tl.load(top_logprobs_ptr + row * stride_top + cols, mask=mask)
    tl.store(out + HEADER + k_max + cols, top_logprobs.to(tl.int32, bitcast=True), mask=mask)


def pack_reference(
    tokens: torch.Tensor, logprobs: LogprobBuffers, out: torch.Tensor, peak: torch.Tensor | None = None
) -> None:
    k = logprobs.k_max
    out[:, 0].copy_(tokens)
    out[:, 1].copy_(logprobs.status if peak is None else ~torch.isfinite(peak))
    out[:, 2].copy_(logprobs.logprob.view(torch.int32))
    out[:, 3].copy_(logprobs.rank)
    out[:, 4].copy_(logprobs.logsumexp.view(torch.int32))
    out[:, HEADER : HEADER + k].copy_(logprobs.top_ids)
    out[:, HEADER + k :].copy_(logprobs.top_logprobs.view(torch.int32))
