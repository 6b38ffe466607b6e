"""The penalties' device state, which ops/penalties.py reads inside the captured step, and the slots that index it.

A penalized (or biased) request takes a slot when its first token is sampled (its prefill's last chunk) and holds
it until it ends. Its sampled tokens are counted on the device by the step that samples them, so no token history
goes up per step: only its prompt, stop ids and logit_bias, once, when it takes the slot. A preempted request keeps
its slot, as its tokens (hence its counts) do not change."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from qwen3_runtime.ops.penalties import PenaltyRows, SlotState, apply_penalties
from qwen3_runtime.params import MAX_LOGIT_BIAS, MAX_STOP_IDS
from qwen3_runtime.request import Request
from qwen3_runtime.step_inputs import StepInputs


@dataclass
class PenaltySlots:
    # Its output_counts has one row more than the slots: the rows without a slot count their tokens there.
    state: SlotState
    eos_token_ids: tuple[int, ...]
    free: list[int]
    held: dict[int, int]  # request_id -> slot

    @classmethod
    def allocate(cls, num_slots: int, vocab: int, eos_token_ids: Iterable[int], device: torch.device) -> PenaltySlots:
        state = SlotState(
            output_counts=torch.zeros(num_slots + 1, vocab, dtype=torch.int32, device=device),
            prompt_mask=torch.zeros(num_slots, vocab, dtype=torch.uint8, device=device),
            stop_ids=torch.full((num_slots, MAX_STOP_IDS), -1, dtype=torch.int32, device=device),
            num_bias=torch.zeros(num_slots, dtype=torch.int32, device=device),
            bias_ids=torch.zeros(num_slots, MAX_LOGIT_BIAS, dtype=torch.int32, device=device),
            bias_values=torch.zeros(num_slots, MAX_LOGIT_BIAS, dtype=torch.float32, device=device),
        )
        return cls(state, tuple(eos_token_ids), list(reversed(range(num_slots))), {})

    def slot(self, req: Request) -> int:
        """req's slot, -1 when it holds none."""
        return self.held.get(req.request_id, -1)

    def acquire(self, reqs: Iterable[Request]) -> None:
        """A slot for each penalized request that has none yet: its counts zeroed, its stop ids, logit_bias and
        prompt written (one upload: the biases travel as their float32 bits). Slots are as many as the running
        requests can be, preempted ones included (the scheduler readmits those before any new request), so one
        is always free."""
        state = self.state
        for req in reqs:
            if not req.params.penalized or req.request_id in self.held:
                continue
            if not self.free:
                raise RuntimeError(f"no free penalty slot for request {req.request_id}: {len(self.held)} are held")
            slot = self.held[req.request_id] = self.free.pop()
            stops = req.params.min_tokens_stop_ids(self.eos_token_ids)
            bias = req.params.logit_bias or {}
            n, bias_bits = len(bias), np.asarray(list(bias.values()), dtype=np.float32).view(np.int32).tolist()
            ids = stops + [-1] * (MAX_STOP_IDS - len(stops)) + list(bias) + bias_bits + req.prompt
            ids = torch.tensor(ids, dtype=torch.int64).to(state.output_counts.device, non_blocking=True)
            state.stop_ids[slot] = ids[:MAX_STOP_IDS]
            state.num_bias[slot] = n
            if n:
                state.bias_ids[slot, :n] = ids[MAX_STOP_IDS : MAX_STOP_IDS + n]
                state.bias_values[slot, :n] = (
                    ids[MAX_STOP_IDS + n : MAX_STOP_IDS + 2 * n].to(torch.int32).view(torch.float32)
                )
            state.output_counts[slot].zero_()
            state.prompt_mask[slot].zero_()
            state.prompt_mask[slot, ids[MAX_STOP_IDS + 2 * n :]] = 1

    def release(self, request_id: int) -> None:
        """Free the request's slot, if it holds one."""
        slot = self.held.pop(request_id, None)
        if slot is not None:
            self.free.append(slot)

    def apply(self, logits: torch.Tensor, inp: StepInputs, rows: int) -> torch.Tensor:
        """The penalized copy of the first `rows` staged rows' logits; the rows asking processed logprobs also get
        theirs written over `logits`, which their logprobs are taken from."""
        staged = inp.penalty_slot, inp.presence, inp.frequency, inp.repetition, inp.suppress_stop
        per_row = PenaltyRows(*(t[:rows] for t in staged))
        return apply_penalties(logits, per_row, self.state, write_rows=inp.processed[:rows])

    def count(self, tokens: torch.Tensor, slot: torch.Tensor) -> None:
        """Add each row's sampled token to its slot's counts (rows without a slot to the spare last row)."""
        # One flat scatter_add_ (atomic adds, capturable in a CUDA graph, no index sort).
        counts = self.state.output_counts
        rows = torch.where(slot < 0, len(counts) - 1, slot)
        flat = rows * counts.shape[1] + tokens
        counts.view(-1).scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
