"""The public engine: load a model from YAML, accept requests, run continuous batching."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from qwen3_runtime.config import Config, ConfigError, load_config
from qwen3_runtime.device import num_kv_blocks, resolve_device, resolve_dtype
from qwen3_runtime.kv_cache import BlockManager, allocate_kv_cache
from qwen3_runtime.loader import load_model
from qwen3_runtime.params import SamplingParams
from qwen3_runtime.request import PENDING, Request, RequestMetrics, RequestOutput, Status
from qwen3_runtime.runner import ModelRunner, RowResult, RunnerStats, StepInFlight
from qwen3_runtime.scheduler import Scheduler


@dataclass
class _Launched:
    """A decode step in flight, and where in each sequence's output its token goes."""

    step: StepInFlight
    token_index: list[int]


class Runtime:
    def __init__(self, config: Config) -> None:
        self.config = config
        engine = config.engine
        self.device = resolve_device(engine.device)
        self.dtype = resolve_dtype(config.model.dtype, self.device)
        self.model = load_model(config.model, self.device, self.dtype)
        arch = self.model.config
        if engine.max_model_len > arch.max_position_embeddings:
            raise ConfigError(
                f"engine.max_model_len={engine.max_model_len} is out of range: must be <= "
                f"max_position_embeddings={arch.max_position_embeddings} of the model"
            )
        self.model.model.rotary.build_table(engine.max_model_len, self.device)
        num_blocks = num_kv_blocks(engine, arch, self.device, self.dtype)
        self.kv_cache = allocate_kv_cache(arch, num_blocks, engine.block_size, self.dtype, self.device)
        self.scheduler = Scheduler(engine, BlockManager(num_blocks, engine.block_size))
        self.runner = ModelRunner(self.model, self.kv_cache, config)
        self.eos_token_ids = set(arch.eos_token_ids)
        self._next_id = 0
        self.num_generated = 0
        self._in_flight: _Launched | None = None

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> Runtime:
        return cls(load_config(path, overrides))

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def add_request(self, prompt: list[int], params: SamplingParams) -> int:
        """Queue a request and return its id; a bad request raises ValueError naming the parameter."""
        self._validate(prompt, params)
        req = Request(
            self._new_id(),
            list(prompt),
            params,
            seed=params.seed if params.seed is not None else random.getrandbits(63),
            arrival_time=time.perf_counter(),
        )
        self.scheduler.add(req)
        return req.request_id

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None

    def step(self) -> list[RequestOutput]:
        """One prefill or decode batch; returns the requests that finished in it. With async scheduling a
        decode step is read by the next call, after that call has launched the step after it."""
        if self._in_flight is not None:
            return self._step_ahead()
        reqs, is_prefill = self.scheduler.schedule()
        if not reqs:
            return []
        if is_prefill:
            return self._record(reqs, self.runner.prefill(reqs))
        if self.runner.overlappable(reqs):
            self._in_flight = self._launch(reqs, previous=None)
            return []
        return self._record(reqs, self.runner.decode(reqs))

    def _step_ahead(self) -> list[RequestOutput]:
        """Launch the next decode step (inputs fed on the device from the one in flight), then read the
        one in flight. Not when a prefill is due: it waits until nothing is in flight."""
        current, self._in_flight = self._in_flight, None
        if not self.scheduler.can_admit():
            ending = frozenset(id(req) for req in current.step.reqs if self._reaches_length(req))
            reqs = self.scheduler.decode_batch(finishing=ending)
            if reqs and self.runner.overlappable(reqs):
                self._in_flight = self._launch(reqs, previous=current)
        return self._record(current.step.reqs, self.runner.collect(current.step), current.token_index)

    def _launch(self, reqs: list[Request], previous: _Launched | None) -> _Launched:
        rows = {id(req): row for row, req in enumerate(previous.step.reqs)} if previous else {}
        step = self.runner.launch_decode(reqs, [rows.get(id(req), -1) for req in reqs])
        token_index = [len(req.output) for req in reqs]
        for req in reqs:
            req.output.append(PENDING)
        return _Launched(step, token_index)

    def _record(
        self, reqs: list[Request], results: list[RowResult], token_index: list[int] | None = None
    ) -> list[RequestOutput]:
        """Each sequence's new token, logprobs and finish; token_index: the slots launched steps hold for
        them (an async sequence that ends here drops the slot of the step after, whose row is discarded)."""
        now = time.perf_counter()
        finished = []
        for i, (req, result) in enumerate(zip(reqs, results)):
            if req.status is Status.FINISHED:  # ended with the step before: this row is discarded
                continue
            self.num_generated += 1
            if req.first_token_time is None:
                req.first_token_time = now
            req.error = req.error or result.error
            if not req.error:
                if token_index is None:
                    req.output.append(result.token_id)
                else:
                    req.output[token_index[i]] = result.token_id
                req.logprobs.append(result.logprob)
            reason = "error" if req.error else self._finish_reason(req, result.token_id)
            if reason:
                if token_index is not None:
                    del req.output[token_index[i] + (not req.error) :]
                req.finish_reason, req.finished_time = reason, now
                self.scheduler.finish(req)
                finished.append(_to_output(req))
        return finished

    @property
    def stats(self) -> RunnerStats:
        """Steps, device-to-host copies and bytes, host synchronisations so far."""
        return self.runner.stats

    def generate(
        self,
        prompts: Seq[list[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run prompts to completion. A rejected request comes back with `error` set and no tokens;
        the others are served as usual. Outputs are in the order of `prompts`."""
        params = params or SamplingParams()
        per_request = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_request) != len(prompts):
            raise ValueError(f"params has {len(per_request)} entries for {len(prompts)} prompts")
        outputs: dict[int, RequestOutput] = {}
        ids = []
        for prompt, p in zip(prompts, per_request):
            try:
                ids.append(self.add_request(prompt, p))
            except ValueError as e:
                ids.append(self._new_id())
                prompt_ids = list(prompt) if isinstance(prompt, (list, tuple)) else []
                outputs[ids[-1]] = RequestOutput(ids[-1], prompt_ids, [], None, None, "error", error=str(e))
        total = sum(p.max_tokens for i, p in zip(ids, per_request) if i not in outputs)
        with tqdm(total=total, unit="tok", disable=not use_tqdm, dynamic_ncols=True) as bar:
            while self.has_unfinished():
                before = self.num_generated
                for out in self.step():
                    outputs[out.request_id] = out
                bar.update(self.num_generated - before)
        return [outputs[i] for i in ids]

    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params={params!r} is invalid: expected SamplingParams")
        if not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
            raise ValueError("prompt is empty: a request needs at least one prompt token id")
        max_len = self.config.engine.max_model_len
        if len(prompt) > max_len:
            raise ValueError(f"prompt has {len(prompt)} tokens: it must be at most engine.max_model_len={max_len}")
        vocab = self.vocab_size
        for name, ids in (("prompt", prompt), ("stop_token_ids", params.stop_token_ids)):
            for i, tok in enumerate(ids):
                if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < vocab:
                    raise ValueError(f"{name}[{i}]={tok!r} is out of range: token ids must be integers in [0, {vocab})")
        max_logprobs = self.config.logprobs.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is None:
                continue
            if max_logprobs == -1 and not -1 <= value <= vocab:
                raise ValueError(f"{name}={value} is out of range: must be in [-1, {vocab}] (-1: the whole vocabulary)")
            if max_logprobs != -1 and not 0 <= value <= max_logprobs:
                raise ValueError(
                    f"{name}={value} is out of range: must be in [0, {max_logprobs}] "
                    f"(logprobs.max_logprobs; -1, the full vocabulary, needs max_logprobs: -1)"
                )

    def _finish_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return "stop"
        return "length" if self._reaches_length(req, ahead=req.output[-1] == PENDING) else None

    def _reaches_length(self, req: Request, ahead: bool = False) -> bool:
        """Whether its output is at max_tokens or its tokens at max_model_len (`ahead`: not counting the
        last slot, which belongs to a step launched after the one being read)."""
        produced = len(req.output) - ahead
        return produced >= req.params.max_tokens or len(req.prompt) + produced >= self.config.engine.max_model_len


def _to_output(req: Request) -> RequestOutput:
    wants_logprobs = req.params.logprobs is not None
    return RequestOutput(
        req.request_id,
        req.prompt,
        req.output,
        req.logprobs if wants_logprobs else None,
        req.prompt_logprobs,
        req.finish_reason,
        req.error,
        RequestMetrics(req.arrival_time, req.first_token_time, req.finished_time),
    )
