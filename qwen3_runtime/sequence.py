"""A request's state as it moves through the scheduler."""
from __future__ import annotations

from collections import abc
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Optional

from qwen3_runtime.packing import StepLogprobs
from qwen3_runtime.params import SamplingParams

if TYPE_CHECKING:
    from qwen3_runtime.logprobs import TokenLogprob


# A sampled token still on the device (async scheduling): its output slot holds this until read.
PENDING = -1


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: int
    prompt: list[int]
    params: SamplingParams
    seed: int  # the request's seed, or one drawn at submission
    output: list[int] = field(default_factory=list)
    logprobs: StepLogprobs = field(init=False)
    prompt_logprobs: Optional[abc.Sequence[Optional[TokenLogprob]]] = None
    block_table: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: Optional[str] = None  # stop | length | error
    error: Optional[str] = None
    arrival_time: float = 0.0
    first_token_time: Optional[float] = None
    finished_time: Optional[float] = None

    def __post_init__(self) -> None:
        self.logprobs = StepLogprobs(self.params.logprobs or 0)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def needs_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None


@dataclass
class RequestMetrics:
    """perf_counter() timestamps: TTFT = first_token_time - arrival_time."""

    arrival_time: float
    first_token_time: Optional[float]
    finished_time: Optional[float]


@dataclass
class RequestOutput:
    """What `Runtime.generate` returns per request; `error` is set when the request was rejected or failed."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: Optional[abc.Sequence[Optional[TokenLogprob]]]
    prompt_logprobs: Optional[abc.Sequence[Optional[TokenLogprob]]]
    finish_reason: Optional[str]
    error: Optional[str] = None
    metrics: Optional[RequestMetrics] = None

    @property
    def ttft(self) -> Optional[float]:
        """Seconds from arrival to the first token (None when none was produced)."""
        if self.metrics is None or self.metrics.first_token_time is None:
            return None
        return self.metrics.first_token_time - self.metrics.arrival_time

    @property
    def tpot(self) -> Optional[float]:
        """Seconds per output token after the first (None with fewer than two tokens)."""
        if self.ttft is None or len(self.token_ids) < 2:
            return None
        return (self.metrics.finished_time - self.metrics.first_token_time) / (len(self.token_ids) - 1)
