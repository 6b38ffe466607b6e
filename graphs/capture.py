"""One CUDA graph per (size bucket, variant) of a step function that reads and writes only static
buffers, the size being a decode step's rows or a prefill's tokens. A batch is padded up to the nearest
bucket and replayed; a batch over the largest bucket, and every run where graphs are off (the CPU),
calls the same step eagerly, padded the same way, so padding and masking are exercised everywhere."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

Step = Callable[[int, Hashable], Any]
WARMUP_RUNS = 2  # eager runs before a capture: the first compiles Triton kernels, both settle the allocator


def default_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8, up to and including max_batch."""
    sizes = {b for b in (1, 2, 4) if b < max_batch} | set(range(8, max_batch, 8)) | {max_batch}
    return sorted(sizes)


def token_buckets(max_tokens: int) -> list[int]:
    """Steps of 16 up to 256, of 64 up to 1024, then of 256, up to and including max_tokens: padding stays
    a small share of a prefill (whose tokens are its prompt chunks plus the decoding rows riding along)."""
    steps = [*range(16, 256, 16), *range(256, 1024, 64), *range(1024, max_tokens, 256)]
    return sorted({size for size in steps if size < max_tokens} | {max_tokens})


class StepGraphs:
    """`step(padded_rows, variant)` must only read inputs from, and write results to, static buffers; what it
    returns is kept at capture and returned again by every replay. A tensor it allocates in the shared pool is
    held there once per graph: large results belong in a static buffer (a view of it costs nothing).
    `variants`: the same for every bucket, or a function giving each bucket's."""

    def __init__(
        self,
        step: Step,
        buckets: Sequence[int],
        variants: Sequence[Hashable] | Callable[[int], Sequence[Hashable]] = (None,),
    ) -> None:
        if not buckets or min(buckets) < 1:
            raise ValueError(f"buckets={list(buckets)!r} is invalid: need at least one size >= 1")
        self.step = step
        self.buckets = sorted(set(buckets))
        self.variants_of: Callable[[int], Sequence[Hashable]] = (
            variants if callable(variants) else lambda _, every=list(variants): every
        )
        self.graphs: dict[tuple[int, Hashable], tuple[torch.cuda.CUDAGraph, Any]] = {}
        self._pool: Any = None

    def padded_size(self, num_rows: int) -> int:
        """The bucket a batch of `num_rows` is padded to (itself when over the largest bucket)."""
        i = bisect.bisect_left(self.buckets, num_rows)
        return self.buckets[i] if i < len(self.buckets) else num_rows

    def capture(self, variants: Callable[[Hashable], bool] = lambda _: True) -> None:
        """The variants `variants` picks, of every bucket that has them; largest bucket first, so smaller graphs
        reuse its memory in the one shared pool. A later call (variants first needed later) adds to that pool."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        every = dict.fromkeys(v for bucket in self.buckets for v in self.variants_of(bucket))
        for variant in filter(variants, every):
            for padded_rows in reversed(self.buckets):
                if variant not in self.variants_of(padded_rows) or (padded_rows, variant) in self.graphs:
                    continue
                for _ in range(WARMUP_RUNS):
                    self.step(padded_rows, variant)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    outputs = self.step(padded_rows, variant)
                self.graphs[(padded_rows, variant)] = (graph, outputs)
        torch.cuda.synchronize()

    def run(self, num_rows: int, variant: Hashable = None) -> Any:
        """Run the step for `num_rows` real rows, padded to their bucket (padded_size); returns its outputs."""
        padded_rows = self.padded_size(num_rows)
        captured = self.graphs.get((padded_rows, variant))
        if captured is None:
            variants = self.variants_of(min(padded_rows, self.buckets[-1]))
            if self.graphs and (variant not in variants or padded_rows <= self.buckets[-1]):
                raise KeyError(f"variant {variant!r} was not captured for {padded_rows} rows (variants: {variants})")
            return self.step(padded_rows, variant)
        graph, outputs = captured
        graph.replay()
        return outputs
