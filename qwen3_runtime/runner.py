"""Runs the model for a scheduled batch and returns host results with one compact copy per step.

Decode: stage the rows into static buffers, replay the bucket's CUDA graph (model -> lm_head ->
sampling -> logprobs reduction -> packing), one copy into pinned memory, wait once. With async
scheduling the wait for one step comes after the next step is launched (launch_decode / collect):
the next step's input ids are read on the device from the step before.
Prefill: an eager forward over whole prompts, prompt logprobs over chunks of positions, then the
same sampling / reduction / packing for each prompt's last position.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from graphs import StepGraphs, default_buckets
from qwen3_runtime.config import Config
from qwen3_runtime.kv_cache import cdiv
from qwen3_runtime.logprobs import LogprobBuffers, TokenLogprob, reduce_logprobs, token_logprob_from_row
from qwen3_runtime.model import AttentionMetadata, Qwen3ForCausalLM
from qwen3_runtime.ops import num_sms
from qwen3_runtime.ops.decode_attention import default_num_splits
from qwen3_runtime.ops.embedding import embed
from qwen3_runtime.ops.greedy import greedy_max
from qwen3_runtime.packing import PackedLogprobs, pack, packed_width
from qwen3_runtime.request import Request
from qwen3_runtime.sampler import processed_logits, sample
from qwen3_runtime.step_inputs import RequestRow, StepInputs

GREEDY, RANDOM = "greedy", "random"  # graph variants: only random batches sort and draw noise
NOT_FINITE = "the model's logits for this request were not finite (NaN or inf); the request was stopped"


@dataclass
class RowResult:
    token_id: int
    logprob: TokenLogprob | np.ndarray | None = None  # a packed row on the device path
    error: str | None = None


@dataclass(eq=False)
class StepInFlight:
    """A launched step whose results have not been read: they land in `packed_host[buffer]`."""

    reqs: list[Request]
    rows: int
    lp_logits: torch.Tensor
    buffer: int


@dataclass
class RunnerStats:
    """Counted at the runner's copy and sync points. capture_s: the graph capture's wall time (Triton
    compilation included where the kernel cache is cold), which grows with a graph per bucket, variant
    and result buffer."""

    decode_steps: int = 0
    prefill_steps: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0
    host_syncs: int = 0
    capture_s: float = 0.0


class ModelRunner:
    def __init__(self, model: Qwen3ForCausalLM, kv_cache: torch.Tensor, config: Config) -> None:
        engine, self.lp_config = config.engine, config.logprobs
        self.async_scheduling = engine.async_scheduling
        self.model, self.kv_cache, self.device = model, kv_cache, kv_cache.device
        self.block_size, self.max_model_len = engine.block_size, engine.max_model_len
        vocab, max_rows = model.config.vocab_size, engine.max_num_seqs
        # max_logprobs -1 allows the full vocabulary: such rows take the host path, others this width.
        self.k_max = self.lp_config.max_logprobs if self.lp_config.max_logprobs >= 0 else 20
        pin = self.device.type == "cuda"
        self.inputs = StepInputs.allocate(max_rows, cdiv(engine.max_model_len, engine.block_size), self.device)
        self.staging = StepInputs.allocate(*self.inputs.block_tables.shape, torch.device("cpu"), pin=pin)
        # What each staging row holds, so a row is rewritten only when that changes: its request (whose
        # constants padding overwrites) and its block table (table, length; padding leaves tables alone).
        self._staged_requests: list[Request | None] = [None] * max_rows
        self._staged_tables: list[tuple[list[int] | None, int]] = [(None, 0)] * max_rows
        self.logprobs = LogprobBuffers.allocate(max_rows, self.k_max, vocab, self.device)
        self.prompt_logprobs = LogprobBuffers.allocate(self.lp_config.prompt_chunk_size, self.k_max, vocab, self.device)
        # A step's results, two sets in turn (see _next_buffer): its copy out never reads what the step after
        # it is writing, and never lands on results not read yet (async scheduling).
        self.packed = torch.zeros(2, max_rows, packed_width(self.k_max), dtype=torch.int32, device=self.device)
        self.packed_host = torch.zeros_like(self.packed, device="cpu", pin_memory=pin)
        self._buffer = 0
        self._unread = [False, False]
        # Decode attention's split counts: zero between calls, so allocated once, before any capture.
        self.split_arrivals = torch.zeros(
            max_rows, model.config.num_key_value_heads, dtype=torch.int32, device=self.device
        )
        # When each buffer's copy has landed, and when the staging rows were last copied out.
        self._copied = [torch.cuda.Event() for _ in range(2)] if pin else None
        # The copy out runs on its own stream, so the next step does not queue behind it (H200, Qwen3-4B,
        # graph replays with the step's copies: 2.399 -> 2.390 ms a step at batch 1, 2.600 -> 2.595 at 8).
        self._copy_stream = torch.cuda.Stream(self.device) if pin else None
        self._staging_copied = torch.cuda.Event() if pin else None
        # Prompt logprobs of a whole prefill, packed like a step's rows (O(tokens * (k + 1)), not O(vocab)).
        self.prompt_packed = torch.zeros(
            engine.max_num_batched_tokens, packed_width(self.k_max), dtype=torch.int32, device=self.device
        )
        self.prompt_packed_host = torch.zeros_like(self.prompt_packed, device="cpu", pin_memory=pin)
        self.stats = RunnerStats()
        self.graphs = StepGraphs(
            self._decode_step,
            engine.cuda_graph_buckets or default_buckets(max_rows),
            variants=[(variant, buffer) for variant in (GREEDY, RANDOM) for buffer in (0, 1)],
        )
        if pin and engine.cuda_graphs:
            start = time.perf_counter()
            with torch.inference_mode():
                self.graphs.capture()
            self.stats.capture_s = time.perf_counter() - start

    def decode(self, reqs: list[Request]) -> list[RowResult]:
        """One token (and its logprobs) for each running sequence."""
        return self.collect(self.launch_decode(reqs))

    @torch.inference_mode()
    def launch_decode(self, reqs: list[Request], prev_rows: list[int] | None = None) -> StepInFlight:
        """Stage and run a decode step without waiting for it. prev_rows[i] >= 0: reqs[i]'s input token is
        the one sampled for that row by the step still in flight (its host value not known yet)."""
        batch = self.graphs.padded_size(len(reqs))
        self._stage(reqs, batch, prev_rows)
        buffer = self._next_buffer()
        _, lp_logits = self.graphs.run(len(reqs), (_variant(reqs), buffer))
        self.stats.decode_steps += 1
        return self._copy_out(reqs, batch, lp_logits, buffer)

    def overlappable(self, reqs: list[Request]) -> bool:
        """Whether a step over `reqs` may stay in flight while the next one runs (async scheduling): not
        when a row takes the host logprobs path, which reads the step's logits after the wait (the next
        step reuses them)."""
        return self.async_scheduling and not any(
            req.params.logprobs is not None and self._host_path(req.params.logprobs) for req in reqs
        )

    def _decode_step(self, batch: int, key: tuple[str, int]) -> torch.Tensor:
        """The captured step, one per (variant, buffer): reads only static inputs, writes its results into
        `self.packed[buffer]`."""
        variant, buffer = key
        inp = self.inputs
        num_splits = default_num_splits(
            batch, self.model.config.num_key_value_heads, self.max_model_len, num_sms(self.device)
        )
        meta = AttentionMetadata(
            slot_mapping=inp.slot_mapping[:batch],
            block_tables=inp.block_tables[:batch],
            seq_lens=inp.seq_lens[:batch],
            num_splits=num_splits,
            split_arrivals=self.split_arrivals[:batch],
        )
        # With async scheduling, rows fed by the step in flight read its sampled token here.
        fed_from = (inp.prev_row[:batch], self.packed[buffer ^ 1, :, 0]) if self.async_scheduling else (None, None)
        embeds = embed(self.model.model.embed_tokens.weight, inp.input_ids[:batch], *fed_from)
        hidden = self.model(None, inp.positions[:batch], self.kv_cache, meta, inputs_embeds=embeds)
        return self._sample_and_reduce(self.model.compute_logits(hidden), batch, variant, self.packed[buffer])

    def _next_buffer(self) -> int:
        """The step's set of the double buffers: the one the step before did not use, whose last results,
        those of the step before that, must have been read (collect) by now."""
        if self._unread[self._buffer ^ 1]:
            raise RuntimeError("a step was launched before the results of the step two before it were collected")
        self._buffer ^= 1
        return self._buffer

    def _copy_out(self, reqs: list[Request], rows: int, lp_logits: torch.Tensor, buffer: int) -> StepInFlight:
        """The step's one device-to-host copy of `self.packed[buffer]`, on the copy stream after the step."""
        self._unread[buffer] = True
        source, target = self.packed[buffer, :rows], self.packed_host[buffer, :rows]
        if self._copy_stream is None:
            target.copy_(source)
        else:
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._copy_stream):
                target.copy_(source, non_blocking=True)
                self._copied[buffer].record()
        return StepInFlight(reqs, rows, lp_logits, buffer)

    @torch.inference_mode()
    def prefill(self, reqs: list[Request]) -> list[RowResult]:
        """Whole prompts (or a preempted sequence's tokens) in one pass; samples each one's next token."""
        lengths = [req.num_tokens for req in reqs]
        cu_seqlens = np.cumsum([0] + lengths).tolist()
        positions = np.concatenate([np.arange(n) for n in lengths])
        slots = np.concatenate([self._slots(req, np.arange(req.num_tokens)) for req in reqs])
        meta = AttentionMetadata(slot_mapping=self._tensor(slots), cu_seqlens=cu_seqlens)
        hidden = self.model(
            self._tensor(np.concatenate([req.tokens for req in reqs])), self._tensor(positions), self.kv_cache, meta
        )
        packed_prompts = self._prompt_logprobs(reqs, hidden, cu_seqlens)
        rows = len(reqs)
        self._stage(reqs, rows)
        last = self.model.compute_logits(hidden[self._tensor(cu_seqlens[1:]) - 1])
        buffer = self._next_buffer()
        lp_logits = self._sample_and_reduce(last, rows, _variant(reqs), self.packed[buffer])
        self.stats.prefill_steps += 1
        results = self.collect(self._copy_out(reqs, rows, lp_logits, buffer))
        self._unpack_prompt_logprobs(packed_prompts)  # landed with the step's copy
        return results

    def _prompt_logprobs(self, reqs: list[Request], hidden: torch.Tensor, cu_seqlens: list[int]) -> list[Request]:
        """Logprobs of prompt tokens 1..n-1 (token 0 has no context), raw, `prompt_chunk_size` positions
        at a time: at most [chunk, V] logits exist at once. Device-path requests' packed results are
        copied out once, after the last chunk, and read after the step's one wait (returns those
        requests); host-path requests take the full-row path."""
        on_device, chunk = [], self.lp_config.prompt_chunk_size
        for req, start in zip(reqs, cu_seqlens):
            if not req.needs_prompt_logprobs:
                continue
            if not self._host_path(req.params.prompt_logprobs):
                on_device.append((req, start))
                continue
            rows, targets = _scored_positions([(req, start)])
            entries = [None]
            for begin in range(0, len(rows), chunk):
                logits = self.model.compute_logits(hidden[self._tensor(rows[begin : begin + chunk])])
                entries += [
                    self._from_full_row(row, target, req.params.prompt_logprobs)
                    for row, target in zip(logits, targets[begin : begin + chunk])
                ]
            _set_prompt_logprobs(req, entries)
        if not on_device:
            return []
        rows, targets = _scored_positions(on_device)
        num_top = np.repeat(
            [req.params.prompt_logprobs for req, _ in on_device], [len(req.prompt) - 1 for req, _ in on_device]
        )
        rows, targets, num_top = self._tensor(np.stack([rows, targets, num_top]))  # one upload
        packed = self.prompt_packed[: len(rows)]
        for begin in range(0, len(rows), chunk):
            part = slice(begin, begin + chunk)
            out = self.prompt_logprobs.head(len(rows[part]))
            reduce_logprobs(
                self.model.compute_logits(hidden[rows[part]]), targets[part], num_top[part], self.k_max, out=out
            )
            pack(targets[part], out, packed[part])
        self.prompt_packed_host[: len(rows)].copy_(packed, non_blocking=True)
        self.stats.d2h_copies += 1
        self.stats.d2h_bytes += packed.numel() * packed.element_size()
        return [req for req, _ in on_device]

    def _unpack_prompt_logprobs(self, reqs: list[Request]) -> None:
        """Each request's block of the landed prompt copy, kept packed (PackedLogprobs) until read."""
        host, begin = self.prompt_packed_host.numpy(), 0
        for req in reqs:
            end = begin + len(req.prompt) - 1
            _set_prompt_logprobs(req, PackedLogprobs(host[begin:end].copy(), req.params.prompt_logprobs, leading=1))
            begin = end

    def _sample_and_reduce(self, logits: torch.Tensor, batch: int, variant: str, packed: torch.Tensor) -> torch.Tensor:
        """Sample, reduce the rows that asked for logprobs, pack it all into `packed[:batch]`.
        Returns the logits the logprobs are taken from (raw, or processed per row)."""
        inp = self.inputs
        if variant == GREEDY:
            peak, tokens = greedy_max(logits)  # ties: the lower token id
            lp_logits = logits
        else:
            params = inp.sampling(batch)
            processed = processed_logits(logits, params)
            peak, tokens = logits.amax(dim=-1), sample(processed, params)
            lp_logits = torch.where(inp.processed[:batch, None] != 0, processed, logits)
        out = self.logprobs.head(batch)
        reduce_logprobs(
            lp_logits, tokens, inp.num_top[:batch], self.k_max, row_mask=inp.wants_logprobs[:batch], out=out
        )
        pack(tokens, out, packed[:batch], peak)
        return lp_logits

    def collect(self, step: StepInFlight) -> list[RowResult]:
        """Wait for a launched step's copy and turn its rows into results."""
        reqs, lp_logits = step.reqs, step.lp_logits
        host = self._wait_for_copy(step)[: len(reqs)]
        results = [RowResult(token, error=NOT_FINITE if status else None) for token, status in host[:, :2].tolist()]
        on_device, on_host = [], []
        for i, req in enumerate(reqs):
            if req.params.logprobs is not None and not results[i].error:
                (on_host if self._host_path(req.params.logprobs) else on_device).append(i)
        for i, row in zip(on_device, host[on_device]):  # a copy: the pinned buffer is reused next step
            results[i].logprob = row  # built into a TokenLogprob when read (StepLogprobs)
        for i in on_host:
            results[i].logprob = self._from_full_row(lp_logits[i], results[i].token_id, reqs[i].params.logprobs)
        return results

    def _wait_for_copy(self, step: StepInFlight) -> np.ndarray:
        """The one synchronisation of a step: its packed copy has landed (a step after it may still run)."""
        if self._copied is not None:
            self._copied[step.buffer].synchronize()
        self._unread[step.buffer] = False
        self.stats.host_syncs += 1
        self.stats.d2h_copies += 1
        self.stats.d2h_bytes += step.rows * self.packed.shape[-1] * 4
        return self.packed_host[step.buffer].numpy()

    def _host_path(self, k: int) -> bool:
        """The old design (a full row to the host, float64 scan): by config, or for k = -1 (the whole
        vocabulary) and k above the static width, allowed only when max_logprobs is -1."""
        return self.lp_config.path == "host" or k == -1 or k > self.k_max

    def _from_full_row(self, row: torch.Tensor, token: int, k: int) -> TokenLogprob | None:
        host_row = row.cpu()
        self.stats.d2h_copies += 1
        self.stats.d2h_bytes += host_row.numel() * host_row.element_size()
        self.stats.host_syncs += 1
        try:
            return token_logprob_from_row(host_row, token, k)
        except ValueError:  # a row that is not finite: the request is failed by its caller
            return None

    def _stage(self, reqs: list[Request], batch: int, prev_rows: list[int] | None = None) -> None:
        """Fill the rows (each feeding its last token, or with prev_rows the token the step in flight
        samples for that row) and padding up to `batch`, then copy them over."""
        # The last copy out of these rows must have run: it was queued right behind the step already
        # waited for, so this wait is almost never taken.
        if self._staging_copied is not None and not self._staging_copied.query():
            self._staging_copied.synchronize()
        bs = self.block_size
        positions = [req.num_tokens - 1 for req in reqs]
        new_requests = {i: self._request_row(req) for i, req in enumerate(reqs) if self._staged_requests[i] is not req}
        self.staging.fill(
            len(reqs),
            batch,
            input_ids=[req.last_token for req in reqs],
            positions=positions,
            slot_mapping=[req.block_table[p // bs] * bs + p % bs for req, p in zip(reqs, positions)],
            seq_lens=[p + 1 for p in positions],
            prev_rows=prev_rows or [-1] * len(reqs),
            requests=new_requests,
        )
        self._staged_requests[:batch] = reqs + [None] * (batch - len(reqs))
        tables = self.staging.block_tables.numpy()
        for i, req in enumerate(reqs):
            # A row's table changes only when a block is added or the row holds another table (another
            # request, or this one readmitted after preemption: release() gives it a new list).
            staged_table, staged_len = self._staged_tables[i]
            if staged_table is not req.block_table or staged_len != len(req.block_table):
                tables[i, : len(req.block_table)] = req.block_table
                self._staged_tables[i] = (req.block_table, len(req.block_table))
        self.inputs.copy_from(self.staging, batch)
        if self._staging_copied is not None:
            self._staging_copied.record()

    def _request_row(self, req: Request) -> RequestRow:
        p, k = req.params, req.params.logprobs
        device_k = k if k is not None and not self._host_path(k) else None
        processed = (p.logprobs_mode or self.lp_config.mode) == "processed"
        return RequestRow((p.top_k, req.seed, device_k or 0, device_k is not None, processed), (p.temperature, p.top_p))

    def _slots(self, req: Request, positions: np.ndarray) -> np.ndarray:
        table = np.asarray(req.block_table, dtype=np.int64)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def _tensor(self, values) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.int64)).to(self.device, non_blocking=True)


def _scored_positions(seqs_and_starts: list[tuple[Request, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the prefill's hidden states that score prompt tokens 1..n-1, and those tokens."""
    rows = [start + np.arange(len(req.prompt) - 1) for req, start in seqs_and_starts]
    targets = [np.asarray(req.prompt[1:], dtype=np.int64) for req, _ in seqs_and_starts]
    return np.concatenate(rows), np.concatenate(targets)


def _set_prompt_logprobs(req: Request, entries: Seq[TokenLogprob | None]) -> None:
    req.prompt_logprobs = entries
    if entries.count(None) > 1:  # beyond the first token's
        req.error = NOT_FINITE


def _variant(reqs: list[Request]) -> str:
    return RANDOM if any(not s.params.greedy for s in reqs) else GREEDY
