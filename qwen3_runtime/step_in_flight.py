"""A launched step until the runtime reads it: its rows' output slots, its sampling tail until that is launched (a
masked step's waits for the grammar masks), where its packed results land; and RowResult, a row as read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from qwen3_runtime.logprobs import TokenLogprob
from qwen3_runtime.request import Request
from qwen3_runtime.sampling_tail.prompt_logprobs import ScoredSpan

# Samples the staged rows and packs them into the runner's `latest`; returns what host-path logprobs are read from.
Tail = Callable[[], torch.Tensor | None]


@dataclass
class RowResult:
    token_id: int
    logprob: TokenLogprob | np.ndarray | None = None  # a packed row on the device path
    error: str | None = None


@dataclass(eq=False)
class StepInFlight:
    """A launched step whose results are not read yet. reqs[i]'s token goes to req.output[output_slots[i]],
    which holds PENDING until then. `tail` is its sampling until launched (a masked step's after its forward, by
    ModelRunner.launch_tail; the others' at once); then the packed results are copied out through buffer
    `buffer` of the runner's outputs."""

    reqs: list[Request]
    output_slots: list[int]
    padded_rows: int  # the rows the tail runs over
    tail: Tail | None
    masked: bool  # its tail applies grammar masks, staged just before it
    prompt_logprob_spans: list[ScoredSpan] = field(default_factory=list)  # unpacked after the wait
    lp_logits: torch.Tensor | None = None  # what host-path logprobs rows are read from, after the wait
    buffer: int = -1

    @classmethod
    def reserving(
        cls, reqs: list[Request], padded_rows: int, tail: Tail, masked: bool, spans: list[ScoredSpan] | None = None
    ) -> StepInFlight:
        """The step, each request's output slot reserved: lengths and positions count its token from now on."""
        return cls(reqs, [req.reserve_output_slot() for req in reqs], padded_rows, tail, masked, spans or [])


def previous_rows(reqs: list[Request], previous: StepInFlight | None) -> list[int]:
    """Each request's row in the step in flight (whose sampled token is its input), or -1."""
    rows = {req.request_id: row for row, req in enumerate(previous.reqs)} if previous else {}
    return [rows.get(req.request_id, -1) for req in reqs]
