"""GPU timing shared by the benchmarks: CUDA-graph replay medians and the copy bandwidth ceiling."""

from __future__ import annotations

import statistics

import torch


def graph_us_per_call(step, inputs: list[torch.Tensor], replays: int = 15) -> float:
    """Median µs per call of `step(x)`, captured once per input buffer in one CUDA graph."""
    for x in inputs[:2]:
        step(x)  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x in inputs:
            step(x)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(inputs))
    del graph
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written): the faster of memcpy and a copy kernel."""
    src = torch.empty(2**28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    memcpy_us = graph_us_per_call(lambda s: dst.copy_(s), [src], replays=10)
    kernel_us = graph_us_per_call(lambda s: torch.neg(s, out=dst), [src], replays=10)
    return 2 * src.numel() * src.element_size() / (min(memcpy_us, kernel_us) * 1e-6)
