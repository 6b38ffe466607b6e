"""Prompt logprobs of a prefill: raw logprobs of prompt tokens 1..n-1 (token 0 has no context).

At most [chunk, V] logits exist at once. Device-path results are packed like a step's rows
(O(tokens * (k + 1)), never O(V)), copied out once after the last chunk, and read after the step's one
wait; host-path requests take the full-row path."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

import numpy as np
import torch

from qwen3_runtime.logprobs.host_path import LogprobsRouting, full_row_logprob
from qwen3_runtime.logprobs.reduce import LogprobBuffers, reduce_logprobs
from qwen3_runtime.logprobs.reference import TokenLogprob
from qwen3_runtime.packing import PackedLogprobs, pack, packed_width
from qwen3_runtime.request import Request
from qwen3_runtime.stats import RunnerStats

NOT_FINITE = "the model's logits for this request were not finite (NaN or inf); the request was stopped"

Logits = Callable[[torch.Tensor], torch.Tensor]  # hidden states [T, hidden] -> fp32 logits [T, V]


class PromptLogprobs:
    def __init__(
        self,
        chunk_size: int,
        max_tokens: int,
        routing: LogprobsRouting,
        vocab_size: int,
        device: torch.device,
        stats: RunnerStats,
    ) -> None:
        self.chunk_size, self.routing, self.stats, self.device = chunk_size, routing, stats, device
        self.buffers = LogprobBuffers.allocate(chunk_size, routing.k_max, vocab_size, device)
        self.packed = torch.zeros(max_tokens, packed_width(routing.k_max), dtype=torch.int32, device=device)
        self.host = torch.zeros_like(self.packed, device="cpu", pin_memory=device.type == "cuda")

    def compute(self, reqs: list[Request], hidden: torch.Tensor, starts: Seq[int], logits: Logits) -> list[Request]:
        """Prompt logprobs of the requests that ask, `starts[i]`: reqs[i]'s first row of `hidden`. Returns
        the device-path requests, whose results `unpack` reads once the step's copy has landed."""
        on_device = []
        for req, start in zip(reqs, starts):
            if not req.needs_prompt_logprobs:
                continue
            if self.routing.on_host(req.params.prompt_logprobs):
                self._on_host(req, start, hidden, logits)
            else:
                on_device.append((req, start))
        if on_device:
            self._on_device(on_device, hidden, logits)
        return [req for req, _ in on_device]

    def unpack(self, reqs: list[Request]) -> None:
        """Each request's block of the landed copy, kept packed (PackedLogprobs) until read."""
        host, begin = self.host.numpy(), 0
        for req in reqs:
            end = begin + len(req.prompt) - 1
            _set_prompt_logprobs(req, PackedLogprobs(host[begin:end].copy(), req.params.prompt_logprobs, leading=1))
            begin = end

    def _on_device(self, reqs_and_starts: list[tuple[Request, int]], hidden: torch.Tensor, logits: Logits) -> None:
        rows, targets = _scored_positions(reqs_and_starts)
        num_top = np.repeat(
            [req.params.prompt_logprobs for req, _ in reqs_and_starts],
            [len(req.prompt) - 1 for req, _ in reqs_and_starts],
        )
        rows, targets, num_top = self._tensor(np.stack([rows, targets, num_top]))  # one upload
        packed = self.packed[: len(rows)]
        for begin in range(0, len(rows), self.chunk_size):
            part = slice(begin, begin + self.chunk_size)
            out = self.buffers.head(len(rows[part]))
            reduce_logprobs(logits(hidden[rows[part]]), targets[part], num_top[part], self.routing.k_max, out=out)
            pack(targets[part], out, packed[part])
        self.host[: len(rows)].copy_(packed, non_blocking=True)
        self.stats.count_copy(packed.numel() * packed.element_size(), synced=False)

    def _on_host(self, req: Request, start: int, hidden: torch.Tensor, logits: Logits) -> None:
        rows, targets = _scored_positions([(req, start)])
        entries: list[TokenLogprob | None] = [None]
        for begin in range(0, len(rows), self.chunk_size):
            chunk_logits = logits(hidden[self._tensor(rows[begin : begin + self.chunk_size])])
            k = req.params.prompt_logprobs
            entries += [
                full_row_logprob(row, target, k, self.stats)
                for row, target in zip(chunk_logits, targets[begin : begin + self.chunk_size])
            ]
        _set_prompt_logprobs(req, entries)

    def _tensor(self, values: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)


def _scored_positions(reqs_and_starts: list[tuple[Request, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the prefill's hidden states that score prompt tokens 1..n-1, and those tokens."""
    rows = [start + np.arange(len(req.prompt) - 1) for req, start in reqs_and_starts]
    targets = [np.asarray(req.prompt[1:], dtype=np.int64) for req, _ in reqs_and_starts]
    return np.concatenate(rows), np.concatenate(targets)


def _set_prompt_logprobs(req: Request, entries: Seq[TokenLogprob | None]) -> None:
    req.prompt_logprobs = entries
    if entries.count(None) > 1:  # beyond the first token's
        req.error = NOT_FINITE
