"""Static per-row inputs of a decode step: a pinned host staging copy, filled a field at a time, and
the device copy that the captured graphs read. One host-to-device copy per step: the fields are views
of one byte buffer (three copies kept the GPU idle ~2 µs each before every step)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from qwen3_runtime.sampler import SamplingTensors

# Rows of the int64 table, one entry per batch row each: what changes every step, then what is
# fixed for a request's lifetime (staged from a RequestRow when a request takes the row).
STEP_FIELDS = ("input_ids", "positions", "slot_mapping", "seq_lens", "prev_row")
REQUEST_INT_FIELDS = ("top_k", "seed", "num_top", "wants_logprobs", "processed")
INT_FIELDS = STEP_FIELDS + REQUEST_INT_FIELDS
FLOAT_FIELDS = ("temperature", "top_p")
# prev_row: the row, in the step still in flight, whose sampled token is this row's input (async
# scheduling; -1: input_ids holds it). A padded row: token 0 at position 0, no cache slot (-1: the KV
# store skips it), no context, greedy, no logprobs.
PADDING = {
    "input_ids": 0,
    "positions": 0,
    "slot_mapping": -1,
    "seq_lens": 0,
    "prev_row": -1,
    "top_k": -1,
    "seed": 0,
    "num_top": 0,
    "wants_logprobs": 0,
    "processed": 0,
    "temperature": 0.0,
    "top_p": 1.0,
}
INT_PADDING = np.array([PADDING[f] for f in INT_FIELDS], dtype=np.int64)[:, None]
FLOAT_PADDING = np.array([PADDING[f] for f in FLOAT_FIELDS], dtype=np.float32)[:, None]


class RequestRow(NamedTuple):
    """A request's constant columns, staged when it takes a row rather than every step."""

    ints: tuple[int, ...]  # REQUEST_INT_FIELDS
    floats: tuple[float, ...]  # FLOAT_FIELDS


@dataclass
class StepInputs:
    buffer: torch.Tensor  # uint8: the three fields below, back to back, block tables last
    ints: torch.Tensor  # int64 [len(INT_FIELDS), max_rows]
    floats: torch.Tensor  # f32 [len(FLOAT_FIELDS), max_rows]
    block_tables: torch.Tensor  # int32 [max_rows, max_blocks]

    @classmethod
    def allocate(cls, max_rows: int, max_blocks: int, device: torch.device, pin: bool = False) -> StepInputs:
        shapes = (
            ((len(INT_FIELDS), max_rows), torch.int64),
            ((len(FLOAT_FIELDS), max_rows), torch.float32),
            ((max_rows, max_blocks), torch.int32),
        )
        sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in shapes]  # each a multiple of 8 but the last
        buffer = torch.zeros(sum(sizes), dtype=torch.uint8, device=device, pin_memory=pin)
        starts = np.cumsum([0] + sizes).tolist()
        return cls(
            buffer,
            *(
                buffer[start : start + size].view(dtype).view(shape)
                for start, size, (shape, dtype) in zip(starts, sizes, shapes)
            ),
        )

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in INT_FIELDS:
            return self.ints[INT_FIELDS.index(name)]
        if name in FLOAT_FIELDS:
            return self.floats[FLOAT_FIELDS.index(name)]
        raise AttributeError(name)

    def fill(
        self,
        rows: int,
        batch: int,
        input_ids: list[int],
        positions: list[int],
        slot_mapping: list[int],
        seq_lens: list[int],
        prev_rows: list[int],
        requests: dict[int, RequestRow],
    ) -> None:
        """Set the first `rows` entries (host side, whole NumPy rows at a time: per-element work is what
        costs here) and the request constants of the rows in `requests` (those that hold another
        request than last time: the others keep theirs), and make rows [rows, batch) padding so stale
        rows of an earlier batch never write the cache."""
        ints, floats = self.ints.numpy(), self.floats.numpy()
        ints[: len(STEP_FIELDS), :rows] = (input_ids, positions, slot_mapping, seq_lens, prev_rows)
        for row, request in requests.items():
            ints[len(STEP_FIELDS) :, row] = request.ints
            floats[:, row] = request.floats
        ints[:, rows:batch] = INT_PADDING
        floats[:, rows:batch] = FLOAT_PADDING

    def copy_from(self, host: StepInputs, rows: int) -> None:
        """Everything up to the first `rows` block tables, in one copy."""
        end = self.buffer.numel() - (self.block_tables.shape[0] - rows) * self.block_tables[0].nbytes
        self.buffer[:end].copy_(host.buffer[:end], non_blocking=True)

    def sampling(self, rows: int) -> SamplingTensors:
        # The sampled token sits one position past the input token.
        return SamplingTensors(
            self.temperature[:rows], self.top_k[:rows], self.top_p[:rows], self.seed[:rows], self.positions[:rows] + 1
        )
