from types import SimpleNamespace

import torch

from qwen3_runtime.server import engine_core
from qwen3_runtime.server.engine_client import EngineClient
from qwen3_runtime.server.engine_core import EngineLoop
from qwen3_runtime.server.metrics import ServerMetrics
from qwen3_runtime.stats import RunnerStats


def _runtime(busy: list[bool]) -> SimpleNamespace:
    blocks = SimpleNamespace(num_free_blocks=3, num_blocks=4, query_tokens=0, hit_tokens=0)
    scheduler = SimpleNamespace(running=[1], prefilling=[], waiting=[], blocks=blocks, num_preemptions=0)
    return SimpleNamespace(
        scheduler=scheduler, stats=RunnerStats(), device=torch.device("cpu"), has_unfinished=lambda: busy[0]
    )


def test_engine_memory_is_read_at_most_every_period_while_busy_and_always_when_idle(monkeypatch):
    reads = iter(range(100, 200))
    monkeypatch.setattr(engine_core, "rss_bytes", lambda: next(reads))
    busy = [True]
    loop = EngineLoop(_runtime(busy), inbox=None, outbox=None)
    assert [loop._stats().rss_bytes for _ in range(3)] == [100, 100, 100]  # one read for the steps of a period
    loop.rss_read_at -= engine_core.RSS_PERIOD_S
    assert loop._stats().rss_bytes == 101
    busy[0] = False
    assert [loop._stats().rss_bytes for _ in range(2)] == [102, 103]  # idle: what the leak checks read


def test_the_engine_process_runs_with_engine_cpu_threads_and_reports_its_summary():
    """The spawned engine process builds the Runtime, so the setting must take effect there: its summary reads
    torch's thread count in that process."""
    client = EngineClient("tiny", {"engine.device": "cpu", "engine.cpu_threads": 1}, ServerMetrics())
    try:
        ready = client.start()
    finally:
        client.shutdown()
    assert ready.summary.cpu_threads == 1 and "float32 on cpu with 1 thread; " in str(ready.summary)
    assert ready.summary.max_model_len == ready.limits.max_model_len == 256
