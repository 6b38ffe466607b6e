"""What the API process and the engine process send each other over their pipes: small picklable tuples.

One message per engine step (StepBatch) carries every request's new tokens, so the pipe's cost does not grow
with the token rate of a single request; requests are named by the API process's string ids end to end."""

from __future__ import annotations

from typing import NamedTuple

from qwen3_runtime.logprobs import TokenLogprob
from qwen3_runtime.params import SamplingParams


class AddRequest(NamedTuple):
    request_id: str
    prompt: list[int]
    params: SamplingParams


class AbortRequest(NamedTuple):
    request_id: str


class Update(NamedTuple):
    """A request's new tokens since the engine's last step, as Runtime.take_updates gives them.

    finish_reason "rejected": the engine refused the request (`error` says why; the API process checks first,
    so this is a defence against limits it did not know)."""

    request_id: str
    token_ids: list[int]
    logprobs: list[TokenLogprob | None] | None
    prompt_logprobs: list[TokenLogprob | None] | None
    finish_reason: str | None
    error: str | None
    num_prompt_tokens: int


class EngineStats(NamedTuple):
    """The engine's counters after a step (Runtime.stats and the scheduler's queues), for /metrics."""

    running: int = 0
    waiting: int = 0
    steps: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0
    host_syncs: int = 0


class StepBatch(NamedTuple):
    updates: list[Update]
    stats: EngineStats


class Ready(NamedTuple):
    """Sent once the Runtime is built: the limits the API process checks requests against."""

    vocab_size: int
    max_model_len: int
    max_logprobs: int


class Failed(NamedTuple):
    """The Runtime could not be built (a bad config or checkpoint): the server exits with this message."""

    message: str
