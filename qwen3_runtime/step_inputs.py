"""The decode step's static per-row inputs, and the stager that fills them from the scheduled requests.

The fields are views of one byte buffer, so a step's inputs go to the device in one host-to-device copy
(separate copies each keep the GPU idle before the step)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from qwen3_runtime.kv_cache import cache_slot
from qwen3_runtime.request import Request
from qwen3_runtime.sampler import SamplingTensors

# Rows of the int64 table, one entry per batch row each: what changes every step, then what is
# fixed for a request's lifetime (staged from a RequestRow when a request takes the row).
STEP_FIELDS = ("input_ids", "positions", "slot_mapping", "seq_lens", "prev_row", "suppress_stop")
REQUEST_INT_FIELDS = ("top_k", "seed", "num_top", "wants_logprobs", "processed", "penalty_slot")
INT_FIELDS = STEP_FIELDS + REQUEST_INT_FIELDS
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")
# A padded row: token 0 at position 0, no cache slot (-1: the KV store skips it), no context, greedy,
# no logprobs, no penalties.
PADDING = {"input_ids": 0, "positions": 0, "slot_mapping": -1, "seq_lens": 0, "prev_row": -1, "suppress_stop": 0,
           "top_k": -1, "seed": 0, "num_top": 0, "wants_logprobs": 0, "processed": 0, "penalty_slot": -1,
           "temperature": 0.0, "top_p": 1.0, "min_p": 0.0, "presence": 0.0, "frequency": 0.0,
           "repetition": 1.0}  # fmt: skip
INT_PADDING = np.array([PADDING[f] for f in INT_FIELDS], dtype=np.int64)[:, None]
FLOAT_PADDING = np.array([PADDING[f] for f in FLOAT_FIELDS], dtype=np.float32)[:, None]


def packed_views(
    shapes: tuple[tuple[tuple[int, ...], torch.dtype], ...], device: torch.device, pin: bool = False
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One zeroed byte buffer holding a tensor of each (shape, dtype) back to back, and those views: inputs that
    go to the device in one copy. Each size must keep the next tensor aligned (wider dtypes first)."""
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in shapes]
    buffer = torch.zeros(sum(sizes), dtype=torch.uint8, device=device, pin_memory=pin)
    starts = np.cumsum([0] + sizes).tolist()
    views = [
        buffer[start : start + size].view(dtype).view(shape)
        for start, size, (shape, dtype) in zip(starts, sizes, shapes)
    ]
    return buffer, views


def copy_through_tables(target: torch.Tensor, source: torch.Tensor, tables: torch.Tensor, num_rows: int) -> None:
    """A packed buffer (packed_views) whose last view is block tables, copied up to the end of the first
    `num_rows` tables: the other rows' tables are stale and unread."""
    end = source.numel() - (tables.shape[0] - num_rows) * tables[0].nbytes
    target[:end].copy_(source[:end], non_blocking=True)


def wait_for_host_copy(copied: torch.cuda.Event | None) -> None:
    """Before a pinned host mirror is rewritten: its last copy to the device has left. That copy was queued right
    behind the step already waited for, so this is almost always a query, never a counted host wait."""
    if copied is not None and not copied.query():
        copied.synchronize()


class RequestRow(NamedTuple):
    """A request's constant columns, staged when it takes a row rather than every step."""

    ints: tuple[int, ...]  # REQUEST_INT_FIELDS
    floats: tuple[float, ...]  # FLOAT_FIELDS


@dataclass
class StepInputs:
    buffer: torch.Tensor  # uint8: ints, floats and block tables back to back, block tables last
    ints: torch.Tensor  # int64 [len(INT_FIELDS), max_rows]
    floats: torch.Tensor  # f32 [len(FLOAT_FIELDS), max_rows]
    block_tables: torch.Tensor  # int32 [max_rows, max_blocks]
    # Rows of `ints`, one entry per batch row:
    input_ids: torch.Tensor
    positions: torch.Tensor  # of the input token
    slot_mapping: torch.Tensor  # its cache slot; -1: padding, not stored
    seq_lens: torch.Tensor  # tokens attended to, the input included; 0: padding
    prev_row: torch.Tensor  # row of the step in flight whose sampled token is the input; -1: input_ids holds it
    suppress_stop: torch.Tensor  # 1: fewer than min_tokens tokens out, so the stop ids cannot be sampled
    top_k: torch.Tensor
    seed: torch.Tensor
    num_top: torch.Tensor  # top logprobs asked for
    wants_logprobs: torch.Tensor  # 1: the row is reduced (device-path logprobs)
    processed: torch.Tensor  # 1: logprobs of the processed distribution, 0: raw
    penalty_slot: torch.Tensor  # the request's row of the penalty state (penalty_slots.py); -1: not penalized
    # Rows of `floats`:
    temperature: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor

    @classmethod
    def allocate(cls, max_rows: int, max_blocks: int, device: torch.device, pin: bool = False) -> StepInputs:
        shapes = (
            ((len(INT_FIELDS), max_rows), torch.int64),
            ((len(FLOAT_FIELDS), max_rows), torch.float32),
            ((max_rows, max_blocks), torch.int32),
        )
        buffer, (ints, floats, tables) = packed_views(shapes, device, pin)
        rows = {**dict(zip(INT_FIELDS, ints)), **dict(zip(FLOAT_FIELDS, floats))}
        return cls(buffer, ints, floats, tables, **rows)

    def fill(
        self,
        num_rows: int,
        padded_rows: int,
        input_ids: list[int],
        positions: list[int],
        slot_mapping: list[int],
        seq_lens: list[int],
        prev_rows: list[int],
        suppress_stop: list[bool],
        requests: dict[int, RequestRow],
    ) -> None:
        """Set the first `num_rows` entries (host side, whole NumPy rows at a time: per-element work is what
        costs here) and the constants of the rows in `requests` (those that changed hands: the others keep
        theirs), and make rows [num_rows, padded_rows) padding so stale rows never write the cache."""
        ints, floats = self.ints.numpy(), self.floats.numpy()
        ints[: len(STEP_FIELDS), :num_rows] = (input_ids, positions, slot_mapping, seq_lens, prev_rows, suppress_stop)
        for row, request in requests.items():
            ints[len(STEP_FIELDS) :, row] = request.ints
            floats[:, row] = request.floats
        ints[:, num_rows:padded_rows] = INT_PADDING
        floats[:, num_rows:padded_rows] = FLOAT_PADDING

    def copy_from(self, host: StepInputs, num_rows: int) -> None:
        """Everything up to the first `num_rows` block tables, in one copy."""
        copy_through_tables(self.buffer, host.buffer, host.block_tables, num_rows)

    def sampling(self, rows: int) -> SamplingTensors:
        # The sampled token sits one position past the input token.
        return SamplingTensors(
            self.temperature[:rows],
            self.top_k[:rows],
            self.top_p[:rows],
            self.seed[:rows],
            self.positions[:rows] + 1,
            self.min_p[:rows],
        )


class InputStager:
    """Fills `inputs` (on the device, read by the captured steps) through a pinned host copy. Each row
    remembers what it holds, so a request's constants and block table are rewritten only when they change."""

    def __init__(
        self,
        max_rows: int,
        max_blocks: int,
        block_size: int,
        device: torch.device,
        request_row: Callable[[Request], RequestRow],
    ) -> None:
        pinned = device.type == "cuda"
        self.inputs = StepInputs.allocate(max_rows, max_blocks, device)
        self.host = StepInputs.allocate(max_rows, max_blocks, torch.device("cpu"), pin=pinned)
        self.block_size = block_size
        self._request_row = request_row
        self._row_requests: list[int | None] = [None] * max_rows  # request_id per row
        # Each row's block table and its length when staged; padding leaves tables alone.
        self._row_tables: list[tuple[list[int] | None, int]] = [(None, 0)] * max_rows
        self._host_copied = torch.cuda.Event() if pinned else None  # the host copy may be rewritten

    def stage(self, reqs: list[Request], padded_rows: int, prev_rows: list[int] | None = None) -> None:
        """Row i feeds reqs[i]'s last token (or, where prev_rows[i] >= 0, the token the step in flight
        samples for that row); rows up to `padded_rows` are padding."""
        wait_for_host_copy(self._host_copied)
        positions = [req.num_tokens - 1 for req in reqs]
        changed = {i: self._request_row(req) for i, req in enumerate(reqs) if self._row_requests[i] != req.request_id}
        self.host.fill(
            len(reqs),
            padded_rows,
            input_ids=[req.last_token for req in reqs],
            positions=positions,
            slot_mapping=[cache_slot(req.block_table, p, self.block_size) for req, p in zip(reqs, positions)],
            seq_lens=[p + 1 for p in positions],
            prev_rows=prev_rows or [-1] * len(reqs),
            # Output slots of steps in flight count: their tokens are being produced. A constrained request's
            # min_tokens is held by its grammar mask (sampling_tail/grammar_rows.py).
            suppress_stop=[len(req.output) < req.params.min_tokens and not req.constrained for req in reqs],
            requests=changed,
        )
        self._row_requests[:padded_rows] = [req.request_id for req in reqs] + [None] * (padded_rows - len(reqs))
        self._stage_block_tables(reqs)
        self.inputs.copy_from(self.host, padded_rows)
        if self._host_copied is not None:
            self._host_copied.record()

    def _stage_block_tables(self, reqs: list[Request]) -> None:
        """A row's table changes only when a block is added or the row holds another table (another
        request, or this one readmitted after preemption: the block manager gives it a new list)."""
        tables = self.host.block_tables.numpy()
        for i, req in enumerate(reqs):
            table, length = self._row_tables[i]
            if table is not req.block_table or length != len(req.block_table):
                tables[i, : len(req.block_table)] = req.block_table
                self._row_tables[i] = (req.block_table, len(req.block_table))
