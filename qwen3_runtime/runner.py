"""Runs the model for a scheduled batch and returns host results with one compact copy per step.

Decode: stage the rows into static buffers, replay the bucket's CUDA graph (model -> lm_head ->
penalties -> sampling -> logprobs reduction -> packing), copy the packed rows out; `collect` waits once. With async
scheduling the next step is launched before that wait, its input ids read on the device from the step
in flight. Prefill: a forward over chunks of prompts (each attending to its request's cached KV) and the
decoding rows riding along, replayed from the CUDA graph of its token bucket, then (eagerly) prompt logprobs of
the positions computed and the same sampling, reduction and packing for each prompt's last position; it is
launched, and may stay in flight, as a decode step is. A step with a constrained row launches its forward alone,
its tail at launch_tail once the grammars have seen the step in flight's tokens, their masks filled meanwhile.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import numpy as np
import torch

from graphs import StepGraphs, default_buckets, token_buckets
from qwen3_runtime.config import Config
from qwen3_runtime.layers.attention import AttentionMetadata
from qwen3_runtime.logprobs.host_path import full_row_logprob
from qwen3_runtime.models.qwen3 import Qwen3ForCausalLM
from qwen3_runtime.ops import cdiv, num_sms
from qwen3_runtime.ops.decode_attention import LONG_ROW_TOKENS, default_num_splits, long_row_splits
from qwen3_runtime.packed_rows import packed_width
from qwen3_runtime.prefill_inputs import PrefillStager
from qwen3_runtime.request import Request
from qwen3_runtime.sampling_tail import SamplingTail, TailVariant
from qwen3_runtime.sampling_tail.prompt_logprobs import NOT_FINITE, PromptLogprobs, ScoredSpan
from qwen3_runtime.scheduler import PrefillChunk
from qwen3_runtime.stats import RunnerStats
from qwen3_runtime.step_in_flight import RowResult, StepInFlight, previous_rows
from qwen3_runtime.step_inputs import InputStager
from qwen3_runtime.step_output import StepOutputs


class GraphVariant(NamedTuple):
    """A decode graph's key within its bucket (StepGraphs' variant): the step is captured once per sampling tail
    and attention split; a masked step as two graphs, its forward (tail None) and its tail alone (long_rows False),
    so its grammar masks are copied in between. Hashed as a tuple, since every step looks one up."""

    tail: TailVariant | None  # None: the forward alone, to the logits
    long_rows: bool  # decode attention split for a long row (the bucket's long_row_splits)

    @property
    def split(self) -> bool:
        """A masked step's part, its forward or its tail: captured at the first constrained decode step."""
        return self.tail is None or self.tail.masked


class ModelRunner:
    def __init__(self, model: Qwen3ForCausalLM, config: Config) -> None:
        """The static buffers; the KV cache comes with attach_kv_cache, once it is sized (memory_profile.py)."""
        engine = config.engine
        self.model, self.device = model, model.lm_head.weight.device
        self.kv_cache: torch.Tensor | None = None
        self.cuda_graphs = engine.cuda_graphs and self.device.type == "cuda"
        self.async_scheduling, self.block_size = engine.async_scheduling, engine.block_size
        self.batch_invariant = engine.batch_invariant
        self.max_model_len = engine.max_model_len
        vocab, max_rows = model.config.vocab_size, engine.max_num_seqs
        self.group_size = model.config.num_attention_heads // model.config.num_key_value_heads
        self.stats = RunnerStats()
        self.tail = SamplingTail(max_rows, vocab, model.config.eos_token_ids, config.logprobs, self.device)
        max_blocks = cdiv(engine.max_model_len, engine.block_size)
        self.stager = InputStager(max_rows, max_blocks, engine.block_size, self.device, self.tail.request_row)
        max_tokens = engine.max_step_tokens  # prompt chunks and the decoding rows riding along
        self.prefill_stager = PrefillStager(
            max_tokens, max_rows, max_blocks, engine.block_size, self.group_size, self.device
        )
        self.outputs = StepOutputs(max_rows, packed_width(self.tail.routing.k_max), self.device, self.stats)
        self.prompt_logprobs = PromptLogprobs(
            config.logprobs.prompt_chunk_size, max_tokens, self.tail.routing, vocab, self.device,
            self.stats,
        )  # fmt: skip
        # Decode attention's split counts: zero between calls, so allocated once, before any capture.
        self.split_arrivals = torch.zeros(
            max_rows, model.config.num_key_value_heads, dtype=torch.int32, device=self.device
        )
        # The decode step's logits: static, so every graph's output is this one buffer rather than logits of its
        # own held in the shared pool (they would add up over the buckets and variants).
        self.logits = torch.empty(max_rows, vocab, dtype=torch.float32, device=self.device)
        buckets = engine.cuda_graph_buckets or default_buckets(max_rows)
        kv_heads, sms = model.config.num_key_value_heads, num_sms(self.device)
        # Buckets of few rows attend to a long row with more splits, in graphs of their own.
        self.long_row_splits = {
            b: splits for b in buckets if (splits := long_row_splits(b, kv_heads, self.max_model_len, sms))
        }
        self.graphs = StepGraphs(self._decode_step, buckets, variants=self._decode_variants)
        self.prefill_graphs = StepGraphs(
            self._prefill_forward, token_buckets(min(max_tokens, engine.prefill_graph_max_tokens))
        )

    def attach_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Run on this cache from now on; on a GPU, capture the decode and prefill graphs over it."""
        self.kv_cache = kv_cache
        if self.cuda_graphs:
            # Captures run on padding alone: inputs left by an earlier step (the memory profile's) would send
            # the warm-up runs to tokens and blocks outside a smaller bucket.
            self.stager.stage([], self.graphs.buckets[-1])
            self.prefill_stager.stage([], self.prefill_graphs.buckets[-1])
            start = time.perf_counter()
            with torch.inference_mode():
                if not self.batch_invariant:  # every step then runs as a prefill step
                    self.graphs.capture(lambda key: not key.split)  # the masked steps' on first need
                self.prefill_graphs.capture()
            self.stats.capture_s = time.perf_counter() - start

    def _capture_split(self) -> None:
        """The masked steps' graphs, at the first constrained decode step. Their warm-up runs write `latest`, which
        holds the tokens of the step in flight that the step being launched reads: kept aside and put back."""
        if self.graphs.graphs and not any(key.split for _, key in self.graphs.graphs):
            in_flight = self.outputs.latest.clone()
            self.stager.stage([], self.graphs.buckets[-1])  # on padding alone, as at the start
            self.graphs.capture(lambda key: key.split)
            self.outputs.latest.copy_(in_flight)

    def overlappable(self, step: StepInFlight) -> bool:
        """Whether a launched step may stay in flight while the next one runs (async scheduling): not with a row
        on the host logprobs path or prompt logprobs (read from buffers the next step reuses)."""
        waits = any(self.tail.routing.on_host(r.params.logprobs) for r in step.reqs)
        return self.async_scheduling and not waits and not step.prompt_logprob_spans

    @torch.inference_mode()
    def launch_decode(self, reqs: list[Request], previous: StepInFlight | None = None) -> StepInFlight:
        """Stage and run a decode step without waiting for it. A request also in `previous` (the step in
        flight) takes as input the token that step samples for it, read on the device."""
        padded_rows = self.graphs.padded_size(len(reqs))
        tail = self.tail.variant(reqs)
        if tail.masked:
            self._capture_split()
        self.stager.stage(reqs, padded_rows, previous_rows(reqs, previous))
        long_rows = padded_rows in self.long_row_splits and max(req.num_tokens for req in reqs) >= LONG_ROW_TOKENS
        self.stats.decode_steps += 1
        if tail.masked:  # the forward now, the tail once its masks are in
            self.graphs.run(len(reqs), GraphVariant(None, long_rows))
        sample = functools.partial(self.graphs.run, len(reqs), GraphVariant(tail, long_rows and not tail.masked))
        return self._launch(StepInFlight.reserving(reqs, padded_rows, sample, tail.masked))

    @torch.inference_mode()
    def prefill(self, chunks: list[PrefillChunk], previous: StepInFlight | None = None) -> StepInFlight:
        """Chunks of prompts (or of a preempted request's tokens, or a decoding request's last token) in one pass,
        each attending to the KV its request has in the cache; samples the next token of each request whose last
        chunk this is, without waiting. A decoding request also in `previous` (the step in flight) takes as
        input the token that step samples for it, read on the device."""
        rows = np.cumsum([0] + [chunk.num_tokens for chunk in chunks])  # each chunk's first row of the forward
        prev_rows = previous_rows([c.req for c in chunks], previous)
        self.prefill_stager.stage(chunks, self.prefill_graphs.padded_size(int(rows[-1])), prev_rows)
        hidden = self.prefill_graphs.run(int(rows[-1]))
        spans = [ScoredSpan.of_chunk(c.req, row, c.start, c.end) for c, row in zip(chunks, rows)]
        last = [(c.req, row + c.num_tokens - 1) for c, row in zip(chunks, rows) if c.is_last]
        reqs, sample_rows = [req for req, _ in last], [row for _, row in last]
        prompt_spans, logits = self.prompt_logprobs.compute(
            [s for s in spans if s], hidden, self._prefill_logits, sample_rows
        )
        self.stats.prefill_steps += 1
        if not reqs:  # no prompt ends here: nothing to sample
            return self._launch(StepInFlight.reserving(reqs, 0, lambda: None, False, prompt_spans))
        self.tail.acquire(reqs)  # before staging: the slot is a request constant
        self.stager.stage(reqs, len(reqs))
        tail = self.tail.variant(reqs)
        if logits is None:
            logits = self._prefill_logits(hidden[self._tensor(sample_rows)])
        sample = functools.partial(self._sample, logits, len(reqs), tail)
        return self._launch(StepInFlight.reserving(reqs, len(reqs), sample, tail.masked, prompt_spans))

    @torch.inference_mode()
    def launch_tail(self, step: StepInFlight) -> None:
        """The step's tail, unless it has run (all but a masked one's run at launch), and its results' copy out. A
        masked step's once the grammars have seen every token before its rows' (the runtime reads the step in flight
        first): its masks, filled while its forward runs, are copied in on its stream before its tail."""
        if step.tail is not None:
            if step.masked:
                self.tail.grammar.stage(step.reqs, step.output_slots, step.padded_rows)
            step.lp_logits, step.tail = step.tail(), None
            step.buffer = self.outputs.copy_out(len(step.reqs))

    def release(self, req: Request) -> None:
        """req has ended: its penalty slot, if it holds one, is free."""
        self.tail.release(req)

    def collect(self, step: StepInFlight) -> list[RowResult]:
        """Wait for a launched step's copy and turn its rows into results."""
        host = self.outputs.wait(step.buffer, len(step.reqs))
        results = [RowResult(token, error=NOT_FINITE if status else None) for token, status in host[:, :2].tolist()]
        on_device = []
        for i, req in enumerate(step.reqs):
            k = req.params.logprobs
            if k is None or results[i].error:
                continue
            if self.tail.routing.on_host(k):
                results[i].logprob = full_row_logprob(step.lp_logits[i], results[i].token_id, k, self.stats)
            else:
                on_device.append(i)
        for i, row in zip(on_device, host[on_device]):  # a copy: the pinned rows are reused
            results[i].logprob = row  # built into a TokenLogprob when read (StepLogprobs)
        self.prompt_logprobs.unpack(step.prompt_logprob_spans)
        return results

    def _prefill_forward(self, padded_tokens: int, _: None) -> torch.Tensor:
        """The prefill forward over the staged chunks, captured per token bucket: final hidden states."""
        input_ids, positions, slots, prev_rows = self.prefill_stager.token_inputs(padded_tokens)
        plan = self.prefill_stager.plan(padded_tokens)
        meta = AttentionMetadata(slot_mapping=slots, prefill=plan, batch_invariant=self.batch_invariant)
        return self.model(input_ids, positions, self.kv_cache, meta, self._fed_from(prev_rows))

    def _prefill_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden, invariant=self.batch_invariant)

    def _decode_variants(self, padded_rows: int) -> list[GraphVariant]:
        """The decode step's graph keys for a bucket, in capture order: whole steps, then the masked steps' parts."""
        lengths = (False, True) if padded_rows in self.long_row_splits else (False,)
        whole_or_forward = [tail for tail in TailVariant.every() if not tail.masked] + [None]
        keys = [GraphVariant(tail, long_rows) for tail in whole_or_forward for long_rows in lengths]
        return keys + [GraphVariant(tail, False) for tail in TailVariant.every() if tail.masked]

    def _decode_step(self, padded_rows: int, key: GraphVariant) -> torch.Tensor | None:
        """The captured step, one per _decode_variants key: the forward into `self.logits`, then the tail into
        `self.outputs.latest` (a split key: one of them). Reads only static inputs (and the penalties' state)."""
        if key.tail is None or not key.tail.masked:
            self._decode_forward(padded_rows, key.long_rows)
        return None if key.tail is None else self._sample(self.logits[:padded_rows], padded_rows, key.tail)

    def _decode_forward(self, padded_rows: int, long_rows: bool) -> None:
        inp, rows = self.stager.inputs, slice(padded_rows)
        kv_heads = self.model.config.num_key_value_heads
        meta = AttentionMetadata(
            slot_mapping=inp.slot_mapping[rows],
            block_tables=inp.block_tables[rows],
            seq_lens=inp.seq_lens[rows],
            num_splits=self.long_row_splits[padded_rows]
            if long_rows
            else default_num_splits(padded_rows, kv_heads, self.max_model_len, num_sms(self.device)),
            split_arrivals=self.split_arrivals[rows],
        )
        fed_from = self._fed_from(inp.prev_row[rows])
        hidden = self.model(inp.input_ids[rows], inp.positions[rows], self.kv_cache, meta, fed_from)
        self.model.compute_logits(hidden, out=self.logits[:padded_rows])

    def _fed_from(self, prev_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """With async scheduling, rows fed by the step in flight read its sampled token (column 0 of `latest`)."""
        return (prev_rows, self.outputs.latest[:, 0]) if self.async_scheduling else None

    def _sample(self, logits: torch.Tensor, rows: int, variant: TailVariant) -> torch.Tensor:
        """The tail over the staged rows, packing into `latest`: what the logprobs are taken from."""
        return self.tail.run(logits, self.stager.inputs, rows, variant, self.outputs.latest[:rows])

    def _launch(self, step: StepInFlight) -> StepInFlight:
        """Its tail run now, or, masked, left to launch_tail."""
        if not step.masked:
            self.launch_tail(step)
        return step

    def _tensor(self, values) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.int64)).to(self.device, non_blocking=True)
