"""The sampling tail of a step: from the logits to the packed row each request reads, in one call that the decode
graphs capture and a prefill runs eagerly. It owns what the tail keeps between steps: the penalty slots, the
logprobs buffers, and which requests take the host logprobs path."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from qwen3_runtime.config import LogprobsConfig
from qwen3_runtime.logprobs.host_path import LogprobsRouting
from qwen3_runtime.logprobs.reduce import LogprobBuffers, reduce_logprobs
from qwen3_runtime.ops.grammar_mask import apply_grammar_mask
from qwen3_runtime.ops.greedy import greedy_max
from qwen3_runtime.packing import pack
from qwen3_runtime.penalty_slots import PenaltySlots
from qwen3_runtime.request import Request
from qwen3_runtime.sampler import filter_cutoffs, sample_raw, sample_selected
from qwen3_runtime.sampling_tail.grammar_rows import GrammarRows
from qwen3_runtime.sampling_tail.variant import TOP_K_CAP, Sampler, TailVariant, writes_processed
from qwen3_runtime.step_inputs import RequestRow, StepInputs


class SamplingTail:
    def __init__(
        self, max_rows: int, vocab: int, eos_token_ids: Iterable[int], config: LogprobsConfig, device: torch.device
    ) -> None:
        """Static buffers for `max_rows` rows: the decode graphs read and write these alone."""
        self.logprobs_mode, self.routing = config.mode, LogprobsRouting.from_config(config)
        self.logprobs = LogprobBuffers.allocate(max_rows, self.routing.k_max, vocab, device)
        self.penalties = PenaltySlots.allocate(max_rows, vocab, eos_token_ids, device)
        self.grammar = GrammarRows(max_rows, vocab, self.penalties.eos_token_ids, device)

    def variant(self, reqs: Sequence[Request]) -> TailVariant:
        return TailVariant.of(reqs, self.logprobs_mode)

    def request_row(self, req: Request) -> RequestRow:
        """req's constants in the step inputs (the stager's callback): what the tail reads of its row."""
        p = req.params
        device_k = None if p.logprobs is None or self.routing.on_host(p.logprobs) else p.logprobs
        processed = writes_processed(p, self.logprobs_mode)
        ints = (p.top_k, req.seed, device_k or 0, device_k is not None, processed, self.penalties.slot(req))
        floats = (p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
        return RequestRow(ints, floats)

    def acquire(self, reqs: Iterable[Request]) -> None:
        """A penalty slot for each penalized request without one; before its row is staged (the slot is in it)."""
        self.penalties.acquire(reqs)

    def release(self, req: Request) -> None:
        """req has ended: its penalty slot, if it holds one, is free."""
        self.penalties.release(req.request_id)

    def run(
        self, logits: torch.Tensor, inp: StepInputs, rows: int, variant: TailVariant, out: torch.Tensor
    ) -> torch.Tensor:
        """Penalize, sample, reduce the rows that asked for logprobs, pack it all into `out` (the first `rows`
        rows of the step's outputs), count the penalized rows' tokens. Reads only static buffers, so the decode
        graphs capture it. Returns `logits`, holding what the logprobs are taken from (raw, or processed per row:
        what was sampled from, penalties included)."""
        # Raw logprobs are of the logits before penalties, processed ones of what was sampled: the rows asking
        # processed logprobs get the penalized values (the penalties' pass), then their processed values (the
        # sampling pass), written over the raw logits, which nothing else reads after this.
        # The grammar mask comes first, so the penalties, the sampler and processed logprobs see its tokens as -inf;
        # raw logprobs are of the model's distribution, kept aside before it.
        raw = self._mask(logits, rows) if variant.masked else None
        penalized_logits = self.penalties.apply(logits, inp, rows) if variant.penalized else logits
        if variant.sampler == Sampler.GREEDY:
            peak, tokens = greedy_max(penalized_logits)  # ties: the lower token id
        elif variant.sampler == Sampler.SELECT:
            peak, tokens = sample_selected(
                penalized_logits, inp.sampling(rows), inp.processed[:rows], logits, TOP_K_CAP
            )
        else:
            params = inp.sampling(rows)
            peak = penalized_logits.amax(dim=-1)
            cutoff = filter_cutoffs(penalized_logits, params, peak) if variant.sampler == Sampler.SORT else None
            tokens = sample_raw(penalized_logits, params, peak, inp.processed[:rows], cutoff, write_to=logits)
        if raw is not None:  # the raw rows' logprobs from the unmasked logits
            torch.where(inp.processed[:rows, None] != 0, logits, raw, out=logits)  # in place: no [rows, V] temporary
        reduced = self.logprobs.head(rows)
        reduce_logprobs(
            logits, tokens, inp.num_top[:rows], self.routing.k_max, row_mask=inp.wants_logprobs[:rows], out=reduced
        )
        pack(tokens, reduced, out, peak)
        if variant.penalized:
            self.penalties.count(tokens, inp.penalty_slot[:rows])
        return logits

    def _mask(self, logits: torch.Tensor, rows: int) -> torch.Tensor:
        """Apply the staged grammar masks to `logits` in place; returns the unmasked copy."""
        raw = logits.clone()
        apply_grammar_mask(logits, self.grammar.bitmask, self.grammar.mask_row[:rows])
        return raw
