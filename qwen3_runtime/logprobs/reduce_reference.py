"""`reduce_logprobs`' float64 torch path (any device: CPUs without Triton, and the tests' reference) and the
argument checks both paths share; apart from reduce.py, which holds the buffers and picks the path."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from qwen3_runtime.order_keys import top_ids

if TYPE_CHECKING:
    from qwen3_runtime.logprobs.reduce import LogprobBuffers


def check_inputs(logits, token_ids, num_top, k_max, row_mask) -> None:
    """Shape and dtype checks only (no device data is read)."""
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"logits must be [N, V] fp32/bf16/fp16, got {tuple(logits.shape)} {logits.dtype}")
    if logits.shape[1] == 0 or logits.stride(1) != 1:
        raise ValueError("logits rows must be non-empty and contiguous")
    n_rows = logits.shape[0]
    for name, t in (("token_ids", token_ids), ("num_top", num_top)):
        if t.shape != (n_rows,) or t.dtype.is_floating_point or t.dtype == torch.bool or t.stride(0) != 1:
            raise ValueError(f"{name} must be a contiguous [{n_rows}] integer tensor, got {tuple(t.shape)} {t.dtype}")
    if row_mask is not None and (
        row_mask.shape != (n_rows,) or row_mask.dtype.is_floating_point or row_mask.stride(0) != 1
    ):
        raise ValueError(
            f"row_mask must be a contiguous [{n_rows}] bool or integer tensor, got "
            f"{tuple(row_mask.shape)} {row_mask.dtype}"
        )
    if k_max < 0:
        raise ValueError(f"k_max={k_max} must be >= 0")


def check_out(out: LogprobBuffers, n_rows: int, k_max: int, vocab: int, device: torch.device) -> None:
    """That a caller's buffers fit the call (the kernels would write past them otherwise)."""
    if out.logprob.shape != (n_rows,) or out.k_max != k_max or out.workspace.vocab_size != vocab:
        raise ValueError(
            f"out is sized for N={out.logprob.shape[0]}, k_max={out.k_max}, "
            f"V={out.workspace.vocab_size}; the call needs N={n_rows}, k_max={k_max}, V={vocab}"
        )
    if out.logprob.device != device:
        raise ValueError(f"out is on {out.logprob.device}, logits on {device}")


def reduce_reference(logits, token_ids, num_top, row_mask, out: LogprobBuffers) -> None:
    """The reference path of `reduce_logprobs` into `out`, as `launch_reduce` runs the Triton one: float64, O(V) a
    row and no sort. Each row's passes over the vocabulary run on that row alone, in two scratch rows (on the CPU a
    fresh [N, V] tensor costs more to allocate than to fill); then every output at once. The rank counts the tokens
    ranked before the token (larger, or equal with a lower id: -0.0 equals 0.0), flagged in fp32 (whose sums count
    exactly below 2**24 tokens); the top-k is order_keys.top_ids."""
    n_rows, vocab = logits.shape
    k_max = out.k_max
    on = {"device": logits.device}
    rows = torch.arange(n_rows, **on) if row_mask is None else row_mask.nonzero()[:, 0]
    token, wanted_k = token_ids[rows].long(), num_top[rows].long().clamp(0, min(k_max, vocab))
    lse = torch.full((len(rows),), float("nan"), dtype=torch.float64, **on)  # left NaN on invalid rows
    ahead = torch.zeros(len(rows), dtype=torch.int64, **on)
    order = torch.full((len(rows), k_max), -1, dtype=torch.int64, **on)
    exps = torch.empty(vocab, dtype=torch.float64, **on)
    flags = torch.empty(vocab, dtype=torch.float32, **on)
    for i, (row, t, k) in enumerate(zip(rows.tolist(), token.tolist(), wanted_k.tolist())):
        x = logits[row].float()  # fp32 holds bf16 and fp16 exactly
        peak = float(x.max())
        if not math.isfinite(peak):  # exactly the rows holding NaN or +inf, or only -inf
            continue
        lse[i] = exps.copy_(x).sub_(peak).exp_().sum().log_().add_(peak)  # torch.logsumexp's steps and bits
        if 0 <= t < vocab:
            ahead[i] = torch.gt(x, x[t], out=flags).sum() + torch.eq(x[:t], x[t], out=flags[:t]).sum()
        if k:
            order[i, :k] = top_ids(x, k)
    invalid = lse.isnan()
    status = torch.where(invalid, 1, torch.where((token >= 0) & (token < vocab), 0, 2))
    target = logits[rows, token.clamp(0, vocab - 1)].double() + 0.0  # + 0.0: -0.0 becomes 0.0, which it ties
    nan = torch.tensor(float("nan"), dtype=torch.float64, **on)
    out.status[rows] = status.to(torch.int8)
    out.logsumexp[rows] = lse.float()
    out.logprob[rows] = torch.where(status == 0, target - lse, nan).float()
    out.rank[rows] = torch.where(status == 0, 1 + ahead, -1).int()
    if k_max > 0:
        values = logits[rows[:, None], order.clamp_min(0)].double() + 0.0
        top_lp = torch.where(invalid[:, None], nan, values - lse[:, None])
        out.top_ids[rows] = order.int()
        wanted = torch.arange(k_max, **on) < wanted_k[:, None]
        out.top_logprobs[rows] = torch.where(wanted, top_lp, float("-inf")).float()
