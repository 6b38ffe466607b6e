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
from typing import Optional, Union

import numpy as np
import torch

from qwen3_runtime.logprobs import LogprobBuffers, TokenLogprob

HEADER = 5  # token, status, logprob, rank, logsumexp


def packed_width(k_max: int) -> int:
    return HEADER + 2 * k_max


def pack(tokens: torch.Tensor, status: torch.Tensor, logprobs: LogprobBuffers, out: torch.Tensor) -> None:
    """Write one step's results into `out` [rows, packed_width] int32 (all device-side copies)."""
    k = logprobs.k_max
    out[:, 0].copy_(tokens)
    out[:, 1].copy_(status)
    out[:, 2].copy_(logprobs.logprob.view(torch.int32))
    out[:, 3].copy_(logprobs.rank)
    out[:, 4].copy_(logprobs.logsumexp.view(torch.int32))
    out[:, HEADER:HEADER + k].copy_(logprobs.top_ids)
    out[:, HEADER + k:].copy_(logprobs.top_logprobs.view(torch.int32))


def unpack_rows(rows: np.ndarray, num_top: list[int]) -> list[TokenLogprob]:
    """TokenLogprobs of packed host rows [n, width], row i keeping its first `num_top[i]` top entries.
    Converts only the columns some row reads, in two bulk calls: a long prompt's logprobs are
    thousands of rows, and per-element work is what costs here."""
    k_max = (rows.shape[1] - HEADER) // 2
    k_used = max(num_top, default=0)
    ints = rows[:, :HEADER + k_used].tolist()
    float_columns = [2, 4] + list(range(HEADER + k_max, HEADER + k_max + k_used))
    floats = rows[:, float_columns].view(np.float32).astype(np.float64).tolist()
    return [TokenLogprob(token_id=i[0], logprob=f[0], rank=i[3], logsumexp=f[1], top_ids=i[HEADER:HEADER + k],
                         top_logprobs=f[2:2 + k]) for i, f, k in zip(ints, floats, num_top)]


class PackedLogprobs(Sequence):
    """Logprob entries kept as packed rows and built into a TokenLogprob only when read: for a long
    prompt, creating thousands of Python objects up front would cost more than computing them.
    Entries [0, leading) are None (a prompt's first token has no logprob), as are failed rows (status)."""

    def __init__(self, rows: np.ndarray, num_top: int, leading: int = 0) -> None:
        self.rows, self.num_top, self.leading = rows, num_top, leading

    def __len__(self) -> int:
        return self.leading + len(self.rows)

    def __getitem__(self, index: Union[int, slice]) -> Union[Optional[TokenLogprob], list[Optional[TokenLogprob]]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} entries")
        row = position - self.leading
        if row < 0 or self.rows[row, 1]:
            return None
        return unpack_rows(self.rows[row:row + 1], [self.num_top])[0]

    def count(self, value: object) -> int:
        if value is None:  # without building every entry
            return self.leading + int(np.count_nonzero(self.rows[:, 1]))
        return super().count(value)


class StepLogprobs(Sequence):
    """A request's logprobs, one entry per output token, as the runner gave them: a TokenLogprob (host
    path) or the request's row of that step's packed copy (device path), built into a TokenLogprob
    only when read. Built in the step loop, those objects cost ~2 µs a row of host time per step
    (development CPU) and kept the garbage collector busy (a row view is not a tracked object)."""

    def __init__(self, num_top: int) -> None:
        self.num_top, self.entries = num_top, []

    def append(self, entry: Union[TokenLogprob, np.ndarray, None]) -> None:
        self.entries.append(entry)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: Union[int, slice]) -> Union[Optional[TokenLogprob], list[Optional[TokenLogprob]]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        entry = self.entries[index]
        return unpack_rows(entry[None], [self.num_top])[0] if isinstance(entry, np.ndarray) else entry
