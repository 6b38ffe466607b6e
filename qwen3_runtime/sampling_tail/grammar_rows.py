"""The step's structured-outputs mask on the device: a bitmask [max_rows, ceil(V/32)] int32 and each row's
bitmask row (`mask_row`, -1: unconstrained), read by the masked tail variant (ops/grammar_mask.py).

A masked step stages them after its forward is launched (ModelRunner.launch_tail), so the host fills them while
the GPU runs the forward. Constrained rows are packed at the top of the bitmask, which follows mask_row in one
buffer, so a step copies mask_row and the constrained rows alone, in one copy on the step's stream, before its tail.
The host side (a pinned HostBitmask, which imports xgrammar) is made on the first constrained step, so an engine
that never sees one never loads xgrammar.

min_tokens of a constrained request is held here rather than by the penalties pass (the stager gives its rows no
suppress_stop): while fewer than min_tokens tokens are out, its stop ids are banned from its mask row unless they
are all the grammar allows. There the grammar can only end, and it ends: banning them would leave the row nothing
to sample, which fails the request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import Request
from qwen3_runtime.step_inputs import packed_views, wait_for_host_copy

if TYPE_CHECKING:
    from qwen3_runtime.structured.matcher import HostBitmask


class GrammarRows:
    def __init__(self, max_rows: int, vocab: int, eos_token_ids: Iterable[int], device: torch.device) -> None:
        """Static device buffers (the graphs capture their addresses); the host's come with the first use."""
        self.eos_token_ids, self.device = tuple(eos_token_ids), device
        self._shapes = (((max_rows,), torch.int32), ((max_rows, cdiv(vocab, 32)), torch.int32))
        self.buffer, (self.mask_row, self.bitmask) = packed_views(self._shapes, device)
        self.buffer.fill_(255)  # -1 everywhere: no row masked, every token allowed
        self._host: tuple[torch.Tensor, torch.Tensor, HostBitmask] | None = None
        self._copied = torch.cuda.Event() if device.type == "cuda" else None  # the host buffer may be rewritten

    def stage(self, reqs: Sequence[Request], produced: Sequence[int], padded_rows: int) -> None:
        """Fill and copy the constrained rows' masks, from their matchers' state, and every row's mask_row;
        padding rows and unconstrained ones get -1 (no mask). `produced[i]`: the tokens reqs[i] has before this
        row's (min_tokens)."""
        wait_for_host_copy(self._copied)
        buffer, host_rows, host = self._host_buffers()
        constrained = [i for i, req in enumerate(reqs) if req.constrained]
        host_rows[:padded_rows] = -1
        host_rows[constrained] = torch.arange(len(constrained), dtype=torch.int32)
        host.fill(range(len(constrained)), [reqs[i].matcher for i in constrained])
        for row, i in enumerate(constrained):
            if produced[i] < reqs[i].params.min_tokens:
                host.hold_end(row, reqs[i].params.min_tokens_stop_ids(self.eos_token_ids))
        end = self.mask_row.nbytes + len(constrained) * self.bitmask[0].nbytes
        self.buffer[:end].copy_(buffer[:end], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def _host_buffers(self) -> tuple[torch.Tensor, torch.Tensor, HostBitmask]:
        if self._host is None:
            from qwen3_runtime.structured.matcher import HostBitmask

            buffer, (rows, bitmask) = packed_views(self._shapes, torch.device("cpu"), pin=self.device.type == "cuda")
            self._host = buffer, rows, HostBitmask(bitmask)
        return self._host
