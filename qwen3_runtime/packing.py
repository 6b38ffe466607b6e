"""The one compact device-to-host record of a step: sampled ids and every logprob result.

Layout, one int32 row per batch row, `5 + 2 * k_max` columns (floats stored as their bits):

    0 token id | 1 status | 2 logprob (f32) | 3 rank | 4 logsumexp (f32)
    5 .. 5+k_max top ids | 5+k_max .. 5+2*k_max top logprobs (f32)

So a step copies rows * (5 + 2 * k_max) * 4 bytes: 180 bytes per row at k_max = 20, never
O(vocab). Status: 0 ok, 1 the row's logits were not finite (NaN, +inf or all -inf).
Logprob columns of rows that did not ask for logprobs are stale and never read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from qwen3_runtime.logprobs import LogprobBuffers, TokenLogprob
from qwen3_runtime.ops import use_triton

HEADER = 5  # token, status, logprob, rank, logsumexp


def packed_width(k_max: int) -> int:
    return HEADER + 2 * k_max


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


def unpack_rows(rows: np.ndarray, num_top: int) -> list[TokenLogprob]:
    """TokenLogprobs of packed host rows [n, width], each keeping its first `num_top` top entries.
    Column-wise bulk conversions and one map over the columns: a long prompt's logprobs are thousands of
    rows, and per-element Python work is what costs here."""
    k_max = (rows.shape[1] - HEADER) // 2
    floats = rows[:, [2, 4]].view(np.float32).astype(np.float64)
    top_logprobs = rows[:, HEADER + k_max : HEADER + k_max + num_top].view(np.float32).astype(np.float64)
    return list(
        map(
            TokenLogprob,
            rows[:, 0].tolist(),
            floats[:, 0].tolist(),
            rows[:, 3].tolist(),
            floats[:, 1].tolist(),
            rows[:, HEADER : HEADER + num_top].tolist(),
            top_logprobs.tolist(),
        )
    )


class PackedLogprobs(Sequence):
    """Logprob entries kept as packed rows until they are read or the request finishes (to_list, in one
    bulk unpack), so a long prompt's thousands of TokenLogprob objects are not built in the prefill's step.
    Entries [0, leading) are None (a prompt's first token has no logprob), as are failed rows (status)."""

    def __init__(self, rows: np.ndarray, num_top: int, leading: int = 0) -> None:
        self.rows, self.num_top, self.leading = rows, num_top, leading

    def __len__(self) -> int:
        return self.leading + len(self.rows)

    def __getitem__(self, index: int | slice) -> TokenLogprob | None | list[TokenLogprob | None]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} entries")
        row = position - self.leading
        if row < 0 or self.rows[row, 1]:
            return None
        return unpack_rows(self.rows[row : row + 1], self.num_top)[0]

    def to_list(self) -> list[TokenLogprob | None]:
        """Every entry, built in one bulk unpack_rows: plain data for a RequestOutput."""
        ok = self.rows[:, 1] == 0
        return [None] * self.leading + _built_where(ok.tolist(), self.rows[ok], self.num_top)

    def count(self, value: object) -> int:
        if value is None:  # without building every entry
            return self.leading + int(np.count_nonzero(self.rows[:, 1]))
        return super().count(value)


class StepLogprobs(Sequence):
    """A request's logprobs, one entry per output token, as the runner gave them: a TokenLogprob (host
    path) or the request's row of that step's packed copy (device path), built into a TokenLogprob when
    read or when the request finishes (to_list, in bulk): built every step, those objects would cost host
    time in the step loop and keep the garbage collector busy (a row view is not a tracked object)."""

    def __init__(self, num_top: int) -> None:
        self.num_top, self.entries = num_top, []

    def append(self, entry: TokenLogprob | np.ndarray | None) -> None:
        self.entries.append(entry)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int | slice) -> TokenLogprob | None | list[TokenLogprob | None]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        entry = self.entries[index]
        return unpack_rows(entry[None], self.num_top)[0] if isinstance(entry, np.ndarray) else entry

    def to_list(self) -> list[TokenLogprob | None]:
        """Every entry, the packed rows built in one bulk unpack_rows: plain data for a RequestOutput."""
        is_row = [isinstance(entry, np.ndarray) for entry in self.entries]
        rows = [entry for entry, packed in zip(self.entries, is_row) if packed]
        built = _built_where(is_row, np.stack(rows) if rows else None, self.num_top)
        return [new if packed else entry for new, entry, packed in zip(built, self.entries, is_row)]


def build_latest(logprobs: list[StepLogprobs]) -> None:
    """Build each one's last entry into a TokenLogprob in place, the packed rows among them in one unpack_rows
    per num_top: a step's streamed requests all read theirs, and one by one the unpacks cost host time in the
    step loop."""
    groups: dict[int, list[StepLogprobs]] = {}
    for lps in logprobs:
        if lps.entries and isinstance(lps.entries[-1], np.ndarray):
            groups.setdefault(lps.num_top, []).append(lps)
    for num_top, group in groups.items():
        for lps, built in zip(group, unpack_rows(np.stack([lps.entries[-1] for lps in group]), num_top)):
            lps.entries[-1] = built


def _built_where(mask: list[bool], rows: np.ndarray | None, num_top: int) -> list[TokenLogprob | None]:
    """One entry per `mask` value: the next of `rows` built (all in one unpack_rows) where True, else None."""
    built = iter(unpack_rows(rows, num_top) if rows is not None else [])
    return [next(built) if keep else None for keep in mask]


def plain_logprobs(entries: Sequence[TokenLogprob | None] | None) -> list[TokenLogprob | None] | None:
    """Logprob entries as a plain list, however they were kept (packed rows built in bulk); None stays None."""
    if entries is None:
        return None
    return entries.to_list() if isinstance(entries, (PackedLogprobs, StepLogprobs)) else list(entries)
