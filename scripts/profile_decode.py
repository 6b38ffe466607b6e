"""Where a decode step's time goes: kernels of one captured step (torch.profiler over graph replays),
the replay time, and the engine's wall time per step (with async scheduling the host's work overlaps the GPU's).

Usage: python -m scripts.profile_decode --config qwen3-4b --batch 1 32 --out DIR
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from qwen3_runtime import Runtime
from scripts.profiling import GREEDY_GRAPH, finish_batch, profiled_runtime, start_batch, trace_events
from scripts.report import environment


def kernel_family(name: str) -> str:
    """Groups a kernel by what it does, for the table (cuBLAS names carry tile shapes)."""
    if name.startswith("_"):  # ours (Triton)
        return name
    lowered = name.lower()
    for key, family in (
        ("gemm", "gemm (cuBLAS)"),
        ("gemv", "gemm (cuBLAS)"),
        ("nvjet", "gemm (cuBLAS)"),
        ("sm90", "gemm (cuBLAS)"),
        ("splitkreduce", "gemm (cuBLAS)"),
    ):
        if key in lowered:
            return family
    return name.split("(")[0].split("<")[0][:60]


def profile_batch(rt: Runtime, batch: int, prompt_len: int, replays: int, logprobs: int | None = None) -> dict:
    start_batch(rt, batch, prompt_len, 5, logprobs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        rt.step()
    torch.cuda.synchronize()  # with async scheduling the last step is still in flight: count it whole
    wall_ms = 1e3 * (time.perf_counter() - start) / replays

    graphs = rt.runner.graphs
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        begin.record()
        graphs.run(batch, GREEDY_GRAPH)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    replay_ms = statistics.median(times)

    profiled = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            graphs.run(batch, GREEDY_GRAPH)
        torch.cuda.synchronize()
    events = [e for e in trace_events(prof) if e.get("cat") == "kernel"]
    per_family = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        entry = per_family[kernel_family(e["name"])]
        entry[0] += 1
        entry[1] += e["dur"]
    kernels = sorted(
        ({"kernel": k, "launches": n / profiled, "us": us / profiled} for k, (n, us) in per_family.items()),
        key=lambda r: -r["us"],
    )
    kernel_ms = sum(k["us"] for k in kernels) / 1e3
    finish_batch(rt)
    return {
        "batch": batch,
        "logprobs": logprobs,
        "wall_ms": wall_ms,
        "replay_ms": replay_ms,
        "kernel_ms": kernel_ms,
        "launches": sum(k["launches"] for k in kernels),
        "kernels": kernels,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-4b")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--logprobs", type=int, default=None, help="every row asks for this many")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    rt = profiled_runtime(args.config, args.batch)
    rows = []
    for batch in args.batch:
        row = profile_batch(rt, batch, args.prompt_len, args.replays, args.logprobs)
        rows.append(row)
        print(
            f"batch {batch}: wall {row['wall_ms']:.3f} ms/step, replay {row['replay_ms']:.3f} ms, kernels "
            f"{row['kernel_ms']:.3f} ms in {row['launches']:.0f} launches",
            flush=True,
        )
        for k in row["kernels"][:25]:
            print(f"  {k['us']:9.1f} us  {k['launches']:6.1f}x  {k['kernel']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.json").write_text(json.dumps({"config": args.config, "rows": rows, **environment()}, indent=2))


if __name__ == "__main__":
    main()
