"""The one compact device-to-host record of a step, one int32 row per batch row, and its host views.

Layout, `5 + 2 * k_max` columns (floats stored as their bits):

    0 token id | 1 status | 2 logprob (f32) | 3 rank | 4 logsumexp (f32)
    5 .. 5+k_max top ids | 5+k_max .. 5+2*k_max top logprobs (f32)

So a step copies rows * (5 + 2 * k_max) * 4 bytes: 180 bytes per row at k_max = 20, never
O(vocab). Status: 0 ok, 1 the row's logits were not finite (NaN, +inf or all -inf).
Logprob columns of rows that did not ask for logprobs are stale and never read.

NumPy only: requests and the API server's process read these rows; packing.py writes them on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qwen3_runtime.logprobs import TokenLogprob

HEADER = 5  # token, status, logprob, rank, logsumexp


def packed_width(k_max: int) -> int:
    return HEADER + 2 * k_max


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
