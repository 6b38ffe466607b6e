"""Timing shared by the benchmarks: CUDA-graph replay medians, the bandwidth and matmul rate ceilings (with plain
wall-clock versions on the CPU, so a benchmark's CPU smoke run measures its own floors too)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl


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


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device | str, repeats: int = 10) -> float:
    """Median wall-clock ms of `fn()` after one warm-up call, the device synchronised before and after each
    call: what a caller waiting for the result sees, host work included."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def copy_bandwidth(device: torch.device | str = "cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written): the faster of memcpy and a copy kernel."""
    if torch.device(device).type != "cuda":
        src = torch.empty(2**24, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        return 2 * src.numel() * src.element_size() / (1e-3 * median_ms(lambda: dst.copy_(src), device, 5))
    src = torch.empty(2**28, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    memcpy_us = graph_us_per_call(lambda s: dst.copy_(s), [src], replays=10)
    kernel_us = graph_us_per_call(lambda s: torch.neg(s, out=dst), [src], replays=10)
    return 2 * src.numel() * src.element_size() / (min(memcpy_us, kernel_us) * 1e-6)


@triton.jit
def _read_kernel(src_ptr, out_ptr, chunk, rounds, num_chunks, BLOCK: tl.constexpr):
    """Each round program p sums chunk (p + round) % num_chunks of src through L2 alone (.cg): no SM's L1 serves a
    re-read, and every round reads the whole buffer once."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for r in range(rounds):
        base = src_ptr + ((pid + r) % num_chunks).to(tl.int64) * chunk
        for offset in range(0, chunk, BLOCK):
            acc += tl.load(base + offset + tl.arange(0, BLOCK), cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)


def read_bandwidth(buffer_bytes: int, rounds: int) -> float:
    """Bytes/s all SMs read from a bf16 buffer of `buffer_bytes`: L2's bandwidth while it fits in L2, DRAM's beyond."""
    block, blocks = 8192, buffer_bytes // 2 // 8192  # 16 KB a program in flight, several programs an SM
    blocks_per_program = triton.cdiv(blocks, 8 * torch.cuda.get_device_properties(0).multi_processor_count)
    programs, chunk = blocks // blocks_per_program, blocks_per_program * block
    src = torch.randn(programs * chunk, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(programs * block, device="cuda")
    read = lambda s: _read_kernel[(programs,)](s, out, chunk, rounds, programs, BLOCK=block, num_warps=8)  # noqa: E731
    return src.numel() * 2 * rounds / (graph_us_per_call(read, [src]) * 1e-6)


def stream_bandwidths(device: torch.device | str = "cuda") -> dict[str, float]:
    """What streaming bytes through the device's memory reaches, bytes/s: a copy (read + written) and a plain read
    of a buffer far beyond L2. A byte floor (weights and K/V read once) is taken at the larger, `bandwidth`: a step
    that only reads may reach the read's rate."""
    copy = copy_bandwidth(device)
    if torch.device(device).type == "cuda":
        read = read_bandwidth(4 << 30, 1)
    else:
        src = torch.empty(2**24, dtype=torch.float32, device=device)
        read = src.numel() * src.element_size() / (1e-3 * median_ms(src.sum, device, 5))
    return {"copy_bandwidth_bytes_s": copy, "read_bandwidth_bytes_s": read, "bandwidth_bytes_s": max(copy, read)}


def matmul_rate(device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16) -> float:
    """Dense FLOP/s of a large square matmul (8192^3 cuBLAS GEMM on the GPU, 1024^3 on the CPU): the
    ceiling a compute floor is computed at."""
    n = 8192 if torch.device(device).type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn_like(a)
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench

        ms = do_bench(lambda: a @ b, return_mode="median")
    else:
        ms = median_ms(lambda: a @ b, device, 5)
    return 2 * n**3 / (ms * 1e-3)
