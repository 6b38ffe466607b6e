"""Prometheus metrics for /metrics: request latencies measured in the API process as updates arrive, and the
engine's queues and copy counters from the latest StepBatch (a collector, so they are read, never duplicated)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.server.messages import EngineStats
from qwen3_runtime.server.rss import rss_bytes

if TYPE_CHECKING:
    from qwen3_runtime.server.engine_client import RequestStream

PREFIX = "qwen3_runtime"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Arrival to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            f"{PREFIX}_time_per_output_token_seconds",
            "Per request: (last - first token) / (tokens - 1)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Between a request's successive tokens",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds", "Arrival to the last update", buckets=LATENCY_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens submitted", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter(
            f"{PREFIX}_requests_finished", "Engine requests by finish reason", ["finish_reason"], registry=r
        )
        self.aborted = Counter(f"{PREFIX}_requests_aborted", "Requests whose client went away", registry=r)

    def attach_engine(self, stats: Callable[[], EngineStats]) -> None:
        """Export the engine's latest counters (`stats` returns them) at every scrape."""
        self.registry.register(_EngineCollector(stats))

    def observe_update(self, stream: RequestStream, up: RequestUpdate, now: float) -> None:
        """Latencies of one request's update, as the API process sees it arrive."""
        if up.token_ids:
            if stream.first_token is None:
                stream.first_token = now
                self.ttft.observe(now - stream.arrival)
            else:
                self.itl.observe((now - stream.last_token) / len(up.token_ids))
            stream.last_token = now
            stream.num_tokens += len(up.token_ids)
            self.generation_tokens.inc(len(up.token_ids))
        if up.finish_reason is None:
            return
        reason = "stop" if stream.stopped else up.finish_reason  # a stop string's abort is the client's "stop"
        self.finished.labels(reason).inc()
        self.aborted.inc(reason == "abort")
        self.e2e.observe(now - stream.arrival)
        if stream.num_tokens > 1:
            self.tpot.observe((stream.last_token - stream.first_token) / (stream.num_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator:
        s = self.stats()
        r, steps = s.runner, s.runner.decode_steps + s.runner.prefill_steps
        running = "Requests the engine is running (prefilling or decoding)"
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_running", running, value=s.running)
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_waiting", "Requests waiting for admission", value=s.waiting)
        yield GaugeMetricFamily(
            f"{PREFIX}_kv_blocks_free", "KV cache blocks free or cached with no owner", value=s.free_blocks
        )
        yield GaugeMetricFamily(f"{PREFIX}_kv_blocks_total", "The engine's KV cache blocks", value=s.total_blocks)
        yield CounterMetricFamily(
            f"{PREFIX}_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            value=s.prefix_cache_queries,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_prefix_cache_hits", "Prompt tokens whose KV the prefix cache held", value=s.prefix_cache_hits
        )
        yield CounterMetricFamily(
            f"{PREFIX}_num_preemptions", "Requests preempted for KV blocks and recomputed", value=s.preemptions
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_engine_resident_memory_bytes", "The engine process's resident memory", value=s.rss_bytes
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_api_resident_memory_bytes", "The API process's resident memory", value=rss_bytes()
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_engine_gpu_memory_allocated_bytes",
            "torch.cuda.memory_allocated in the engine (0 on the CPU)",
            value=s.gpu_allocated_bytes,
        )
        yield CounterMetricFamily(f"{PREFIX}_engine_steps", "Engine steps (prefill and decode)", value=steps)
        yield CounterMetricFamily(f"{PREFIX}_engine_d2h_copies", "Device-to-host copies", value=r.d2h_copies)
        yield CounterMetricFamily(f"{PREFIX}_engine_d2h_bytes", "Device-to-host bytes copied", value=r.d2h_bytes)
        yield CounterMetricFamily(f"{PREFIX}_engine_host_syncs", "Host waits on the device", value=r.host_syncs)
        per_step = max(steps, 1)
        yield GaugeMetricFamily(
            f"{PREFIX}_engine_d2h_copies_per_step", "Copies per step so far", value=r.d2h_copies / per_step
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_engine_d2h_bytes_per_step", "Bytes copied per step so far", value=r.d2h_bytes / per_step
        )
