"""The step's structured-outputs mask on the device: a bitmask [max_rows, ceil(V/32)] int32 and each row's
bitmask row (`mask_row`, -1: unconstrained), read by the masked tail variant (ops/grammar_mask.py).

Constrained rows are packed at the top of the bitmask, so a step copies only theirs. Both copies go on the step's
stream right after the inputs' staging copy, before the graph replays. The host side (a pinned HostBitmask, which
imports xgrammar) is made on the first constrained step, so an engine that never sees one never loads xgrammar.
The pinned buffers are reused safely: a step with a constrained row is read before the next step launches
(ModelRunner.overlappable), so its copies are done when the next constrained step overwrites them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import Request

if TYPE_CHECKING:
    from qwen3_runtime.structured.matcher import HostBitmask


class GrammarRows:
    def __init__(self, max_rows: int, vocab: int, device: torch.device) -> None:
        """Static device buffers (the graphs capture their addresses); the host's come with the first use."""
        self.vocab, self.device = vocab, device
        self.bitmask = torch.full((max_rows, cdiv(vocab, 32)), -1, dtype=torch.int32, device=device)
        self.mask_row = torch.full((max_rows,), -1, dtype=torch.int32, device=device)
        self._host: HostBitmask | None = None
        self._host_rows: torch.Tensor | None = None

    def stage(self, reqs: Sequence[Request], padded_rows: int) -> None:
        """Fill and copy the constrained rows' masks and every row's mask_row, for a step taking the masked tail
        (TailVariant.masked); padding rows and unconstrained ones get -1 (no mask)."""
        host, host_rows = self._host_buffers()
        constrained = [i for i, req in enumerate(reqs) if req.constrained]
        host_rows[:padded_rows] = -1
        host_rows[constrained] = torch.arange(len(constrained), dtype=torch.int32)
        host.fill(range(len(constrained)), [reqs[i].matcher for i in constrained])
        count = len(constrained)
        self.bitmask[:count].copy_(host.tensor[:count], non_blocking=True)
        self.mask_row[:padded_rows].copy_(host_rows[:padded_rows], non_blocking=True)

    def _host_buffers(self) -> tuple[HostBitmask, torch.Tensor]:
        if self._host is None:
            from qwen3_runtime.structured.matcher import HostBitmask

            rows = self.bitmask.shape[0]
            pin = self.device.type == "cuda"
            self._host = HostBitmask.allocate(rows, self.vocab, pin=pin)
            self._host_rows = torch.full((rows,), -1, dtype=torch.int32, pin_memory=pin)
        return self._host, self._host_rows
