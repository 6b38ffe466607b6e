"""Per-request sampling parameters, checked when they are made and again, with the model's limits, when
they are submitted (check_request)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from qwen3_runtime.sampler import GREEDY_BELOW
from qwen3_runtime.validation import (
    as_bool,
    check_choice,
    check_float,
    check_int,
    check_range,
    check_token_ids,
    show,
)


@dataclass
class SamplingParams:
    """What a request wants generated; names and defaults follow vLLM.

    A bad value raises ValueError naming the field, the value and the allowed range.
    """

    max_tokens: int = 16
    # 0 (or below sampler.GREEDY_BELOW) is greedy; ties go to the lower token id.
    temperature: float = 1.0
    # -1 (or 0): no top-k filter.
    top_k: int = -1
    top_p: float = 1.0
    # Makes a sampled request's tokens reproducible whatever else is in the batch.
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # Top logprobs per generated token (0: only the sampled token's); None: none.
    logprobs: int | None = None
    # Top logprobs per prompt token (the first prompt token has none); None: none.
    prompt_logprobs: int | None = None
    # raw: logprobs of the model's distribution; processed: of the one sampled from (after
    # temperature, top-k, top-p). None: the config's logprobs.mode.
    logprobs_mode: str | None = None

    def __post_init__(self) -> None:
        """Check every field and normalise NumPy numbers to Python ones. Runs again at submission
        (check_request), as fields may be changed after the params are made."""
        self.max_tokens = check_int("max_tokens", self.max_tokens, lo=1)
        self.temperature = check_float("temperature", self.temperature, lo=0, note="0 is greedy")
        self.top_k = check_int("top_k", self.top_k, lo=-1)
        self.top_p = check_float("top_p", self.top_p, lo=0, hi=1, lo_open=True)
        if self.seed is not None:
            self.seed = check_int("seed", self.seed, lo=0, hi=2**63 - 1)
        self.stop_token_ids = check_token_ids("stop_token_ids", self.stop_token_ids)
        self.ignore_eos = as_bool("ignore_eos", self.ignore_eos)
        if self.logprobs is not None:
            self.logprobs = check_int("logprobs", self.logprobs, lo=-1)
        if self.prompt_logprobs is not None:
            self.prompt_logprobs = check_int("prompt_logprobs", self.prompt_logprobs, lo=-1)
        if self.logprobs_mode is not None:
            check_choice("logprobs_mode", self.logprobs_mode, ("raw", "processed"))

    @property
    def greedy(self) -> bool:
        """Whether the argmax is taken (the sampler's rule: temperature below GREEDY_BELOW, as vLLM's)."""
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class RequestLimits:
    """What a request is checked against that only the loaded model and its config know."""

    vocab_size: int
    max_model_len: int
    # logprobs.max_logprobs: -1 allows the whole vocabulary.
    max_logprobs: int


def check_request(prompt: object, params: object, limits: RequestLimits) -> tuple[list[int], SamplingParams]:
    """The one check of a request: its prompt, every field of its params (again: they may have been
    changed since they were made), and the model's limits. Returns the prompt as a list of ints and a
    checked copy of the params, so later changes to the caller's object cannot reach a queued request.
    Any fault raises ValueError, so a bad request fails alone."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params={show(params)} is invalid: expected SamplingParams")
    params = dataclasses.replace(params)
    vocab = limits.vocab_size
    prompt = check_token_ids("prompt", prompt, vocab)
    if not prompt:
        raise ValueError("prompt is empty: a request needs at least one prompt token id")
    if len(prompt) > limits.max_model_len:
        raise ValueError(
            f"prompt has {len(prompt)} tokens: it must be at most engine.max_model_len={limits.max_model_len}"
        )
    check_token_ids("stop_token_ids", params.stop_token_ids, vocab)
    if params.top_k >= vocab:  # keeps every token, as -1 does; and fits the step's int64 table however large
        params.top_k = -1
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is None:
            continue
        if limits.max_logprobs == -1:
            check_range(name, value, -1, vocab, note="-1: the whole vocabulary")
        else:
            note = "logprobs.max_logprobs; -1, the full vocabulary, needs max_logprobs: -1"
            check_range(name, value, 0, limits.max_logprobs, note=note)
    return prompt, params
