"""What the API process and the engine process send each other over their pipes: small picklable tuples.

One message per engine step (StepBatch) carries every request's new tokens, so the pipe's cost does not grow
with the token rate of a single request; requests are named by the API process's string ids end to end."""

from __future__ import annotations

from typing import Any, NamedTuple

from qwen3_runtime.params import RequestLimits, SamplingParams
from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.stats import RunnerStats
from qwen3_runtime.summary import EngineSummary


class AddRequest(NamedTuple):
    request_id: str
    prompt: list[int]
    params: SamplingParams


class AbortRequest(NamedTuple):
    request_id: str


class EngineStats(NamedTuple):
    """The engine's counters after a step (the scheduler's queues, its KV blocks, its process's memory and
    Runtime.stats), for /metrics: with no request left, free_blocks == total_blocks (none leaked)."""

    running: int = 0
    waiting: int = 0
    runner: RunnerStats = RunnerStats()
    free_blocks: int = 0
    total_blocks: int = 0
    rss_bytes: int = 0  # the engine process's resident memory
    gpu_allocated_bytes: int = 0  # torch.cuda.memory_allocated (0 on the CPU)
    preemptions: int = 0  # requests preempted (freed, requeued, recomputed) so far
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache so far
    prefix_cache_hits: int = 0  # of those, tokens whose KV was reused


class StepBatch(NamedTuple):
    """Runtime.take_updates of one step, named by the API process's ids. finish_reason "rejected": the engine
    refused the request (`error` says why; the API process checks first, so this guards against limits it did
    not know)."""

    updates: list[RequestUpdate]
    stats: EngineStats


class Ready(NamedTuple):
    """Sent once the Runtime is built: the limits the API process checks requests against, and what the server
    reports at startup."""

    limits: RequestLimits
    sampling_defaults: dict[str, Any]  # Runtime.sampling_defaults: what requests leaving those fields unset take
    summary: EngineSummary  # Runtime.summary: the model, its limits, KV capacity and graphs


class Failed(NamedTuple):
    """The Runtime could not be built (a bad config or checkpoint): the server exits with this message."""

    message: str
