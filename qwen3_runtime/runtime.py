"""The public engine: load a model from YAML, accept requests, run continuous batching."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import torch

from qwen3_runtime import generate as batch
from qwen3_runtime.block_manager import BlockManager
from qwen3_runtime.config import Config, load_config
from qwen3_runtime.device import release_memory
from qwen3_runtime.engine_setup import build_engine
from qwen3_runtime.models.hf_config import read_sampling_defaults
from qwen3_runtime.packed_rows import build_latest
from qwen3_runtime.params import RequestLimits, SamplingParams, check_request
from qwen3_runtime.request import PENDING, Request, RequestOutput, RequestUpdate, Status
from qwen3_runtime.request_grammars import RequestGrammars
from qwen3_runtime.scheduler import Scheduler
from qwen3_runtime.stats import RunnerStats
from qwen3_runtime.step_in_flight import RowResult, StepInFlight
from qwen3_runtime.summary import EngineSummary
from qwen3_runtime.tokenizer import Tokenizer, load_tokenizer
from qwen3_runtime.tokenizer.core import prompt_ids

# Token ids, text, or chat messages ([{"role": ..., "content": ...}, ...]).
Prompt = list[int] | str | list[dict]


class Runtime:
    """The engine over one model. close() (or a `with` block) releases its memory at once: a Runtime merely dropped
    keeps it until the garbage collector's next full pass, or until the next Runtime is built."""

    def __init__(self, config: Config) -> None:
        """`config` as given; self.config is it with engine.max_model_len resolved."""
        built = build_engine(config)
        self.config, self.device, self.dtype = built.config, built.device, built.dtype
        self.model, self.runner, self.kv_cache = built.model, built.runner, built.kv_cache
        arch, engine = built.arch, self.config.engine
        self.scheduler = Scheduler(engine, BlockManager(built.num_blocks, engine.block_size, engine.prefix_caching))
        self.eos_token_ids = set(arch.eos_token_ids)
        self.grammars = RequestGrammars(lambda: self.tokenizer, arch.vocab_size, sorted(self.eos_token_ids))
        # What every request is checked against (and the server's API process, before a request is sent here).
        self.limits = RequestLimits(
            arch.vocab_size, engine.max_model_len, config.logprobs.max_logprobs, tuple(sorted(self.eos_token_ids))
        )
        # What requests leaving these SamplingParams fields unset take: generate() without params, the server's.
        use_defaults = config.model.path is not None and config.model.generation_config == "auto"
        self.sampling_defaults = read_sampling_defaults(config.model.path) if use_defaults else {}
        self._next_id = 0
        self.num_generated = 0  # tokens appended to outputs so far
        self._in_flight: StepInFlight | None = None
        self._live: dict[int, Request] = {}  # by request_id, until finished
        self._updates: list[RequestUpdate] = []  # of streamed requests, until taken
        # Returned by the next step(): aborted requests', and those of other requests a generate() call ran to the end.
        self._undelivered: list[RequestOutput] = []
        self._closed = False
        # The model, dtype, device, limits, KV capacity and graphs, as `generate` and `serve` print them.
        self.summary = EngineSummary.of(self, config.engine.max_model_len)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> Runtime:
        return cls(load_config(path, overrides))

    def close(self) -> None:
        """Release the KV cache, the CUDA graphs and the weights now, so that another Runtime in this process has
        their memory; requests still running are dropped, and add_request or step raise RuntimeError after.
        Closing again does nothing."""
        if self._closed:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a step in flight still uses the buffers
        self._closed, self._in_flight = True, None
        self.grammars.close()
        self._live.clear()
        del self.runner, self.kv_cache, self.model, self.scheduler
        release_memory(self.device)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Runtime is closed")

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def stats(self) -> RunnerStats:
        """Steps, device-to-host copies and bytes, host synchronisations so far."""
        return self.runner.stats

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (tokenizer.load_tokenizer), loaded when first used."""
        return load_tokenizer(self.config.model)

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        stream: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> int:
        """Queue a request and return its id; a bad request raises ValueError naming the parameter.
        `prompt`: token ids, text, or chat messages (through the tokenizer's chat template, given
        `chat_template_kwargs`: Qwen3's enable_thinking, as vLLM's LLM.chat takes them). `stream`: report its tokens
        step by step through take_updates()."""
        self._check_open()
        ids = prompt_ids(prompt, lambda: self.tokenizer, chat_template_kwargs or {})
        prompt, params = check_request(ids, params, self.limits)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        req = Request(self._new_id(), prompt, params, seed=seed, stream=stream, arrival_time=time.perf_counter())
        self.grammars.submit(req)  # scheduled once its grammar is compiled
        self.scheduler.add(req)
        self._live[req.request_id] = req
        return req.request_id

    def abort(self, request_id: int) -> None:
        """End a request now (finish_reason "abort") and free its KV blocks; its output comes with the next
        step(). Unknown and finished ids are ignored (a client may abort after the end)."""
        req = self._live.get(request_id)
        if req is None:
            return
        while req.output and req.output[-1] == PENDING:  # rows of steps in flight, discarded when read
            req.output.pop()
        self._undelivered.append(self._end_unrun(req, "abort"))

    def _end_unrun(self, req: Request, reason: str) -> RequestOutput:
        """End req with no token of a step in flight: aborted, or rejected (its error says why)."""
        if req.stream:
            self._updates.append(RequestUpdate(req.request_id, [], None, None, reason, req.error, len(req.prompt)))
        return self._finish(req, len(req.output) - 1, reason, time.perf_counter())

    def take_updates(self) -> list[RequestUpdate]:
        """What streamed requests produced since the last call, in order."""
        updates, self._updates = self._updates, []
        return updates

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None or bool(self._undelivered)

    def step(self) -> list[RequestOutput]:
        """Schedule, run, process: one prefill or decode batch; returns the requests that finished.

        With async scheduling a step stays in flight: the next call launches the step after it (whose
        decoding rows' input tokens the device reads from the step in flight) before processing it, so the
        host schedules and stages while the GPU runs, and the tokens of the step in flight go out while the
        next one runs, a prefill step too. A constrained step launches its forward first, its tail after that
        processing, whose tokens its grammar masks need."""
        self._check_open()
        previous, self._in_flight = self._in_flight, None
        finished, self._undelivered = self._undelivered, []
        finished += [self._end_unrun(req, "rejected") for req in self.grammars.refused()]  # constraint did not compile
        reqs, is_prefill = self.scheduler.schedule(finishing=self._ending(previous))
        launched = None
        if reqs:
            run = self.runner.prefill if is_prefill else self.runner.launch_decode
            launched = run(reqs, previous)
        if previous is not None:
            finished += self._process(previous)  # its tokens advance the grammars the launched step's masks read
        if launched is not None:
            self.runner.launch_tail(launched)  # a masked step's tail: its masks are filled as its forward runs
            if self.runner.overlappable(launched):
                self._in_flight = launched
            else:
                finished += self._process(launched)
        return finished

    def _ending(self, previous: StepInFlight | None) -> frozenset[int]:
        """Ids of the requests the step in flight brings to their length: they take no row after it."""
        if previous is None:
            return frozenset()
        return frozenset(
            req.request_id
            for req, slot in zip(previous.reqs, previous.output_slots)
            if self._reaches_length(req, produced=slot + 1)
        )

    def _process(self, step: StepInFlight) -> list[RequestOutput]:
        """Read a launched step: each request's token and logprobs, and the requests that end with them."""
        results = self.runner.collect(step)
        now = time.perf_counter()
        finished, streamed = [], []
        for req, slot, result in zip(step.reqs, step.output_slots, results):
            if req.status is Status.FINISHED:  # it ended with the step before: this row is discarded
                continue
            self._append(req, slot, result, now)
            reason = self._finish_reason(req, slot, result)
            if reason:
                finished.append(self._finish(req, slot, reason, now))
            if req.stream:
                streamed.append((req, slot, reason))
        build_latest([req.logprobs for req, _, _ in streamed if req.params.logprobs is not None])
        self._updates += [req.update(slot, reason) for req, slot, reason in streamed]
        return finished

    def _append(self, req: Request, slot: int, result: RowResult, now: float) -> None:
        if req.first_token_time is None:
            req.first_token_time = now
        req.error = req.error or result.error or self.grammars.rejection(req, result.token_id)
        if not req.error:
            req.output[slot] = result.token_id
            req.logprobs.append(result.logprob)
            self.num_generated += 1

    def _finish(self, req: Request, slot: int, reason: str, now: float) -> RequestOutput:
        # Slots after this token belong to steps launched after it, whose rows are discarded; a failed
        # request keeps no token of this step either.
        del req.output[slot + (not req.error) :]
        req.finish_reason, req.finished_time = reason, now
        self.scheduler.finish(req)
        self.runner.release(req)
        del self._live[req.request_id]
        return req.to_output()

    def _finish_reason(self, req: Request, slot: int, result: RowResult) -> str | None:
        p = req.params
        if req.error:
            return "error"
        ended = req.matcher is not None and req.matcher.terminated  # the grammar's end, even with ignore_eos
        if result.token_id in p.stop_token_ids or (not p.ignore_eos and result.token_id in self.eos_token_ids) or ended:
            return "stop"
        return "length" if self._reaches_length(req, produced=slot + 1) else None

    def _reaches_length(self, req: Request, produced: int) -> bool:
        """Whether `produced` output tokens reach max_tokens, or with the prompt max_model_len."""
        return produced >= req.params.max_tokens or len(req.prompt) + produced >= self.config.engine.max_model_len

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's defaults (`sampling_defaults`): vLLM's get_default_sampling_params."""
        return SamplingParams(**self.sampling_defaults)

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts (or one prompt: a text, token ids, chat messages) to completion. A rejected request comes
        back with `error` set and no tokens; the others are served as usual. Outputs are in the order of
        `prompts`. `params`: one for all, one per prompt, or None for default_sampling_params();
        `chat_template_kwargs`: for the chat prompts (add_request's). Requests added before keep running beside them;
        those that end meanwhile come with the next step()."""
        return batch.generate(self, prompts, params, use_tqdm, chat_template_kwargs)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1
