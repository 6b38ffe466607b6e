"""Where a prefill step's time goes, per shape: the step's wall time, its forward graph's replay alone, a
timeline of the host's part (before the forward's launch, launching what follows it, the wait, after the wait)
and the GPU's (busy time, kernels by family) from torch.profiler, and the host's hot functions from cProfile.

Usage: python -m scripts.profile_prefill --config qwen3-4b --shapes 1x128 1x1024 [--prompt-logprobs 5] --out DIR
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import statistics
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from qwen3_runtime import Runtime, SamplingParams
from scripts.bench_prefill import GREEDY, one_step_ms, prompts_of, run_to_end
from scripts.profile_decode import kernel_family
from scripts.profiling import trace_events
from scripts.report import environment

_WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def prefill_timeline(trace: list[dict], step: str) -> dict:
    """µs from the step's start: the forward graph's launch, the wait's start and end, the step's end; and the
    GPU's busy µs within the step (kernels and copies, overlaps counted once) and its kernels by family."""
    mark = next(e for e in trace if e.get("name") == step and e.get("ph") == "X" and e.get("cat") == "user_annotation")
    begin, end = mark["ts"], mark["ts"] + mark["dur"]
    inside = lambda e: begin <= e["ts"] <= end  # noqa: E731
    runtime = [e for e in trace if e.get("cat") in ("cuda_runtime", "cuda_driver") and inside(e)]
    correlations = {e["args"]["correlation"] for e in runtime if "correlation" in e.get("args", {})}
    gpu = sorted(
        (e for e in trace if e.get("cat") in ("kernel", "gpu_memcpy") and e["args"].get("correlation") in correlations),
        key=lambda e: e["ts"],
    )
    busy, reach = 0.0, -1.0
    for e in gpu:  # the union of the intervals
        start, stop = e["ts"], e["ts"] + e["dur"]
        busy += max(0.0, stop - max(start, reach))
        reach = max(reach, stop)
    launch = next((e["ts"] for e in runtime if "GraphLaunch" in e["name"]), None)
    waits = [e for e in runtime if e["name"] in _WAITS]
    families: dict[str, float] = collections.defaultdict(float)
    for e in gpu:
        if e.get("cat") == "kernel":
            families[kernel_family(e["name"])] += e["dur"]
    return {
        "step_us": mark["dur"],
        "graph_launch_at_us": None if launch is None else launch - begin,
        "wait_at_us": waits[-1]["ts"] - begin if waits else None,
        "wait_us": sum(e["dur"] for e in waits),
        "gpu_first_at_us": gpu[0]["ts"] - begin if gpu else None,
        "gpu_last_end_at_us": reach - begin,
        "gpu_busy_us": busy,
        "launches": sum(e.get("cat") == "kernel" for e in gpu),
        "kernels_us": dict(sorted(families.items(), key=lambda kv: -kv[1])),
    }


def profile_shape(rt: Runtime, prompts: int, tokens: int, params: SamplingParams, repeats: int) -> dict:
    rng = np.random.default_rng(tokens)
    fresh = lambda: prompts_of(rng, rt.vocab_size, [tokens] * prompts)  # noqa: E731
    for _ in range(3):
        one_step_ms(rt, fresh(), params)
    wall = [one_step_ms(rt, fresh(), params) for _ in range(repeats)]

    # The forward alone: the last step's staged inputs replayed (its request is gone and its blocks free).
    begin, end, replays = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
    for _ in range(repeats):
        begin.record()
        rt.runner.prefill_graphs.run(prompts * tokens)
        end.record()
        end.synchronize()
        replays.append(begin.elapsed_time(end))

    timelines = []
    for i in range(3):
        for prompt in fresh():
            rt.add_request(prompt, params)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function(f"prefill_step_{i}"):
                run_to_end(rt)
            torch.cuda.synchronize()
        timelines.append(prefill_timeline(trace_events(prof), f"prefill_step_{i}"))

    profiler = cProfile.Profile()
    for _ in range(repeats):
        for prompt in fresh():
            rt.add_request(prompt, params)
        torch.cuda.synchronize()
        profiler.enable()
        run_to_end(rt)
        torch.cuda.synchronize()
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    median = lambda key: statistics.median(t[key] for t in timelines if t[key] is not None)  # noqa: E731
    return {
        "shape": f"{prompts}x{tokens}",
        "prompt_logprobs": params.prompt_logprobs,
        "wall_ms": statistics.median(wall),
        "replay_ms": statistics.median(replays),
        "timeline_us": {k: median(k) for k in timelines[-1] if k != "kernels_us"},
        "kernels_us": timelines[-1]["kernels_us"],
        "cprofile_tottime": text.getvalue(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-4b")
    parser.add_argument("--shapes", nargs="+", default=["1x128", "1x1024"], help="PROMPTSxTOKENS")
    parser.add_argument("--prompt-logprobs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    sizes = [tuple(map(int, s.split("x"))) for s in args.shapes]
    rt = Runtime.from_yaml(args.config, overrides={
        "engine.max_num_batched_tokens": max(8192, *(b * n for b, n in sizes)),
        "engine.max_model_len": max(4096, *(n + 1 for _, n in sizes)),
        "engine.max_num_seqs": max(b for b, _ in sizes),
        "engine.prefix_caching": False,
    })  # fmt: skip
    params = SamplingParams(max_tokens=1, prompt_logprobs=args.prompt_logprobs, **GREEDY)
    rows = []
    for b, n in sizes:
        row = profile_shape(rt, b, n, params, args.repeats)
        rows.append(row)
        t = row["timeline_us"]
        print(f"== {row['shape']} prompt_logprobs={args.prompt_logprobs}: wall {row['wall_ms']:.3f} ms, forward replay "
              f"{row['replay_ms']:.3f} ms; profiled step {t['step_us']:.0f} us: graph launched at "
              f"{t['graph_launch_at_us']:.0f}, GPU first at {t['gpu_first_at_us']:.0f}, wait at {t['wait_at_us']:.0f} "
              f"for {t['wait_us']:.0f}, GPU done at {t['gpu_last_end_at_us']:.0f}, busy {t['gpu_busy_us']:.0f} us in "
              f"{t['launches']:.0f} launches")  # fmt: skip
        for family, us in list(row["kernels_us"].items())[:12]:
            print(f"  {us:9.1f} us  {family}")
        print(row["cprofile_tottime"][-4000:], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_prefill.json").write_text(json.dumps({"rows": rows, **environment()}, indent=2))


if __name__ == "__main__":
    main()
