"""Prompt logprobs of a prefill: raw logprobs of prompt tokens 1..n-1 (token 0 has no context).

A forward scores the prompt positions it computes (a whole prompt, or one chunk of it); a request's pieces
gather on it until its last one. At most [chunk, V] logits exist at once. Device-path results are packed like
a step's rows (O(tokens * (k + 1)), never O(V)), copied out once per forward, and read after the step's one
wait; host-path requests take the full-row path."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from qwen3_runtime.logprobs.host_path import LogprobsRouting, full_row_logprob
from qwen3_runtime.logprobs.reduce import LogprobBuffers, reduce_logprobs
from qwen3_runtime.logprobs.reference import TokenLogprob
from qwen3_runtime.packed_rows import PackedLogprobs, packed_width
from qwen3_runtime.packing import pack
from qwen3_runtime.request import Request
from qwen3_runtime.stats import RunnerStats

NOT_FINITE = "the model's logits for this request were not finite (NaN or inf); the request was stopped"

Logits = Callable[[torch.Tensor], torch.Tensor]  # hidden states [T, hidden] -> fp32 logits [T, V]


@dataclass
class ScoredSpan:
    """Prompt positions [start, end) of `req` whose logits this forward computes, in hidden rows from `row`:
    position p scores prompt token p + 1."""

    req: Request
    row: int
    start: int
    end: int

    @classmethod
    def of_chunk(cls, req: Request, row: int, start: int, end: int) -> ScoredSpan | None:
        """The span a forward over req's tokens [start, end) scores, or None when it scores nothing new."""
        last = len(req.prompt) - 1  # positions 0..last-1 score tokens 1..last
        span = cls(req, row, start, min(end, last))
        return span if req.needs_prompt_logprobs and (span.start < span.end or span.is_last) else None

    @property
    def is_last(self) -> bool:
        return self.end >= len(self.req.prompt) - 1

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.start, max(self.start, self.end))


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

    def compute(
        self, spans: list[ScoredSpan], hidden: torch.Tensor, logits: Logits, sample_rows: Seq[int] = ()
    ) -> tuple[list[ScoredSpan], torch.Tensor | None]:
        """Score the spans. Returns the device-path ones, whose results `unpack` reads once the step's copy
        has landed, and the logits of hidden rows `sample_rows` (those the step samples from) when the
        device path's last product computed them beside its chunk, else None."""
        on_device = []
        for span in spans:
            if self.routing.on_host(span.req.params.prompt_logprobs):
                self._on_host(span, hidden, logits)
            else:
                on_device.append(span)
        sampled = self._on_device(on_device, hidden, logits, sample_rows) if on_device else None
        return on_device, sampled

    def unpack(self, spans: list[ScoredSpan]) -> None:
        """Each span's block of the landed copy joins its request's pieces (kept packed until read)."""
        host, begin = self.host.numpy(), 0
        for span in spans:
            end = begin + len(span.positions)
            span.req.prompt_logprob_parts.append(host[begin:end].copy())
            begin = end
            if span.is_last:
                parts = span.req.prompt_logprob_parts
                rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
                _set_prompt_logprobs(span.req, PackedLogprobs(rows, span.req.params.prompt_logprobs, leading=1))

    def _on_device(
        self, spans: list[ScoredSpan], hidden: torch.Tensor, logits: Logits, sample_rows: Seq[int]
    ) -> torch.Tensor | None:
        """The spans' rows in chunks of logits, reduced and packed. The rows the step samples from join the last
        chunk's product: it reads the lm_head weights anyway, and a product of their own would read them again."""
        rows, targets = _scored_rows(spans)
        if not len(rows):  # spans of a prompt's last position alone score nothing
            return None
        num_top = np.repeat([span.req.params.prompt_logprobs for span in spans], [len(s.positions) for s in spans])
        n, s = len(rows), len(sample_rows)
        uploaded = self._tensor(np.concatenate([rows, np.asarray(sample_rows, dtype=np.int64), targets, num_top]))
        gathered, targets, num_top = uploaded.split([n + s, n, n])  # one upload
        packed = self.packed[:n]
        last = (n - 1) // self.chunk_size * self.chunk_size  # the last chunk's first row
        for begin in range(0, last, self.chunk_size):  # each chunk's logits freed before the next product
            end = begin + self.chunk_size
            self._reduce(logits(hidden[gathered[begin:end]]), targets[begin:end], num_top[begin:end], packed[begin:end])
        last_logits = logits(hidden[gathered[last:]])  # the sample rows ride along: gathered ends with them
        self._reduce(last_logits, targets[last:], num_top[last:], packed[last:])
        self.host[:n].copy_(packed, non_blocking=True)
        self.stats.count_copy(packed.numel() * packed.element_size(), synced=False)
        return last_logits[n - last :] if s else None

    def _reduce(
        self, chunk_logits: torch.Tensor, targets: torch.Tensor, num_top: torch.Tensor, packed: torch.Tensor
    ) -> None:
        """Reduce and pack the logits' first len(targets) rows (those scoring prompt tokens)."""
        out = self.buffers.head(len(targets))
        reduce_logprobs(chunk_logits[: len(targets)], targets, num_top, self.routing.k_max, out=out)
        pack(targets, out, packed)

    def _on_host(self, span: ScoredSpan, hidden: torch.Tensor, logits: Logits) -> None:
        rows, targets = _scored_rows([span])
        k = span.req.params.prompt_logprobs
        for begin in range(0, len(rows), self.chunk_size):
            chunk_logits = logits(hidden[self._tensor(rows[begin : begin + self.chunk_size])])
            span.req.prompt_logprob_parts += [
                full_row_logprob(row, target, k, self.stats)
                for row, target in zip(chunk_logits, targets[begin : begin + self.chunk_size])
            ]
        if span.is_last:
            _set_prompt_logprobs(span.req, [None, *span.req.prompt_logprob_parts])

    def _tensor(self, values: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)


def _scored_rows(spans: list[ScoredSpan]) -> tuple[np.ndarray, np.ndarray]:
    """The spans' rows of the forward's hidden states, and the prompt tokens they score."""
    rows = [span.row - span.start + span.positions for span in spans]
    prompts = [np.asarray(span.req.prompt, dtype=np.int64) for span in spans]
    targets = [prompt[span.positions + 1] for prompt, span in zip(prompts, spans)]
    return np.concatenate(rows), np.concatenate(targets)


def _set_prompt_logprobs(req: Request, entries: Seq[TokenLogprob | None]) -> None:
    req.prompt_logprobs, req.prompt_logprob_parts = entries, []
    if entries.count(None) > 1:  # beyond the first token's
        req.error = NOT_FINITE
