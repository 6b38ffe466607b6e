"""Per-request sampling parameters, checked when they are made and again, with the model's limits, when
they are submitted (check_request)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from qwen3_runtime.structured.spec import OutputConstraint
from qwen3_runtime.validation import (
    as_bool,
    check_choice,
    check_float,
    check_int,
    check_range,
    check_token_ids,
    invalid,
    show,
)

# Rows with a smaller temperature are greedy, as in vLLM: logits / 1e-6 overflows float32 for large logits.
GREEDY_BELOW = 1e-5
# A bound for repetition_penalty (vLLM sets none): past it a seen token's logit is all but erased anyway.
MAX_REPETITION_PENALTY = 10.0
# The most ids min_tokens suppresses per request (stop ids and EOS ids): the width of the runner's table.
MAX_STOP_IDS = 32
# The most tokens one request's logit_bias may name (as vLLM's), and OpenAI's range for a bias.
MAX_LOGIT_BIAS, LOGIT_BIAS_RANGE = 1024, 100.0


@dataclass
class SamplingParams:
    """What a request wants generated; names and defaults follow vLLM.

    A bad value raises ValueError naming the field, the value and the allowed range.
    """

    max_tokens: int = 16
    # 0 (or below GREEDY_BELOW) is greedy; ties go to the lower token id.
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
    # OpenAI's penalties over the output's tokens: logit -= frequency_penalty * count + presence_penalty * seen.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Over the prompt's and the output's tokens: a positive logit divided by it, a negative one multiplied.
    repetition_penalty: float = 1.0
    # Stop ids (and EOS, unless ignore_eos) cannot be sampled before this many tokens.
    min_tokens: int = 0
    # Random rows keep the tokens with at least min_p times the most likely token's probability.
    min_p: float = 0.0
    # token id -> a number added to its logit before the penalties (OpenAI's and vLLM's order); None: none.
    logit_bias: dict[int, float] | None = None
    # What the output must match (structured outputs); None: anything. The grammar's end finishes the request
    # with "stop", ignore_eos or not.
    constraint: OutputConstraint | None = None
    # The token id after which the constraint holds (</think> when the answer follows a thinking block); None: from
    # the first generated token.
    constraint_after: int | None = None

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
        self.presence_penalty = check_float("presence_penalty", self.presence_penalty, lo=-2, hi=2)
        self.frequency_penalty = check_float("frequency_penalty", self.frequency_penalty, lo=-2, hi=2)
        self.repetition_penalty = check_float(
            "repetition_penalty", self.repetition_penalty, lo=0, hi=MAX_REPETITION_PENALTY, lo_open=True
        )
        self.min_tokens = check_int(
            "min_tokens", self.min_tokens, lo=0, hi=self.max_tokens, note=f"max_tokens={self.max_tokens}"
        )
        self.min_p = check_float("min_p", self.min_p, lo=0, hi=1)
        if self.logit_bias is not None:
            self.logit_bias = _check_logit_bias(self.logit_bias)
        if self.constraint is not None and not isinstance(self.constraint, OutputConstraint):
            raise invalid("constraint", self.constraint, "an OutputConstraint")
        if self.constraint_after is not None:
            self.constraint_after = check_int("constraint_after", self.constraint_after, lo=0, note="a token id")

    @property
    def greedy(self) -> bool:
        """Whether the argmax is taken (the sampler's rule: temperature below GREEDY_BELOW, as vLLM's), decided in
        float32 as the device decides it: a temperature just under the threshold in float64 may round to it."""
        return bool(np.float32(self.temperature) < np.float32(GREEDY_BELOW))

    @property
    def penalized(self) -> bool:
        """Whether the logits are penalized (or biased) before sampling: the request then holds a penalty slot."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or self.min_tokens > 0
            or bool(self.logit_bias)
        )

    def min_tokens_stop_ids(self, eos_token_ids: Iterable[int]) -> list[int]:
        """The ids suppressed while fewer than min_tokens tokens are out: the stop ids, and the model's EOS ids
        unless ignored."""
        if self.min_tokens == 0:
            return []
        return sorted(set(self.stop_token_ids) | (set() if self.ignore_eos else set(eos_token_ids)))


def _check_logit_bias(value: object) -> dict[int, float]:
    """A copy as {int: float}, so later changes to the caller's dict cannot reach a queued request."""
    if not isinstance(value, dict):
        raise invalid("logit_bias", value, f"a dict of token id -> bias, got {type(value).__name__}")
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias names {len(value)} tokens: at most {MAX_LOGIT_BIAS} are supported")
    bias = {}
    for token, number in value.items():
        token = check_int("logit_bias key", token, lo=0, note="a token id")
        bias[token] = check_float(f"logit_bias[{token}]", number, lo=-LOGIT_BIAS_RANGE, hi=LOGIT_BIAS_RANGE)
    return bias


@dataclass(frozen=True)
class RequestLimits:
    """What a request is checked against that only the loaded model and its config know."""

    vocab_size: int
    max_model_len: int
    # logprobs.max_logprobs: -1 allows the whole vocabulary.
    max_logprobs: int
    # The model's EOS ids, which min_tokens suppresses too.
    eos_token_ids: tuple[int, ...] = ()


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
    if len(prompt) >= limits.max_model_len:  # as in vLLM: max_model_len counts the generated tokens too
        raise ValueError(
            f"prompt has {len(prompt)} tokens: it must be shorter than engine.max_model_len={limits.max_model_len}, "
            "which counts the generated tokens too"
        )
    check_token_ids("stop_token_ids", params.stop_token_ids, vocab)
    if params.constraint_after is not None:
        check_range("constraint_after", params.constraint_after, 0, vocab, hi_open=True, note="a token id")
    for token in params.logit_bias or ():
        check_range("logit_bias key", token, 0, vocab, hi_open=True, note="a token id of the model's vocabulary")
    suppressed = params.min_tokens_stop_ids(limits.eos_token_ids)
    if len(suppressed) > MAX_STOP_IDS:
        raise ValueError(
            f"min_tokens={params.min_tokens} suppresses {len(suppressed)} stop and EOS token ids: at most "
            f"{MAX_STOP_IDS} are supported (fewer stop_token_ids, or ignore_eos)"
        )
    if params.top_k >= vocab:  # keeps every token, as -1 does; and fits the step's int64 table however large
        params.top_k = -1
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is None:
            continue
        if limits.max_logprobs == -1:
            check_range(name, value, -1, vocab, note="-1: the whole vocabulary")
        else:
            limit = "the vocabulary's size" if vocab < limits.max_logprobs else "logprobs.max_logprobs"
            note = f"{limit}; -1, the full vocabulary, needs logprobs.max_logprobs: -1"
            check_range(name, value, 0, min(limits.max_logprobs, vocab), note=note)
    return prompt, params
