"""Benchmark `reduce_logprobs` on a CUDA GPU (written for the H200), V = 151936.

For fp32 and bf16 logits, N rows and top-k, it reports µs per call (median of
CUDA-graph replays) and the achieved bandwidth against the floor (the logits
read once at the device-to-device copy bandwidth measured in the same run),
beside the eager PyTorch path (fp32 log_softmax + topk + gather, also replayed
as a CUDA graph) and the host path (copy each row to the host and run
`token_logprob_from_row`, N <= 32 only). Each graph cycles through enough
input buffers (>= 160 MB) that L2 cannot hold them, so small N is not flattered.

    PYTHONPATH=. python3 scripts/bench_reduce.py --out out/bench [--quick] [--sweep] [--set FIELD=INT]

--sweep adds a comparison of ReduceConfig variants at N = 32 and 256 and a
per-kernel time breakdown; --set overrides the config of the main table.

Writes DIR/reduce.json (every figure, GPU, versions, date, commit) and DIR/reduce.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch

from qwen3_runtime.logprobs import token_logprob_from_row
from qwen3_runtime.logprobs.reduce import LogprobBuffers, ReduceConfig, reduce_logprobs
from scripts.report import environment
from scripts.timing import copy_bandwidth, graph_us_per_call

VOCAB = 151936
ROTATE_BYTES = 160 * 2**20  # > 3x the H200's 50 MB L2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SWEEP = [  # tilings and launch variants compared by --sweep (candidates=1: always the slow exact fallback)
    ReduceConfig(),
    ReduceConfig(pdl=False),
    ReduceConfig(pdl_first=False),
    ReduceConfig(finish_warps=4),
    ReduceConfig(finish_warps=16),
    ReduceConfig(candidates=1),
    ReduceConfig(chunk=2048),
    ReduceConfig(chunk=8192, num_warps=8),
    ReduceConfig(block=64, group=64),
    ReduceConfig(group=16),
]


def realistic_logits(n_rows: int, dtype: torch.dtype) -> torch.Tensor:
    """randn * 3 plus a few large spikes per row, like real next-token logits."""
    x = torch.randn(n_rows, VOCAB, device="cuda") * 3
    spikes = torch.randint(0, VOCAB, (n_rows, 4), device="cuda")
    x.scatter_add_(1, spikes, 8 + 6 * torch.rand(n_rows, 4, device="cuda"))
    return x.to(dtype)


def rotating_inputs(n_rows: int, dtype: torch.dtype) -> list[torch.Tensor]:
    one = n_rows * VOCAB * torch.finfo(dtype).bits // 8
    count = max(2, min(512, -(-ROTATE_BYTES // one)))
    return [realistic_logits(n_rows, dtype) for _ in range(count)]


def reduce_step(n_rows: int, k: int, config: ReduceConfig):
    out = LogprobBuffers.allocate(n_rows, k, VOCAB, "cuda", config)
    token_ids = torch.randint(0, VOCAB, (n_rows,), device="cuda")
    num_top = torch.full((n_rows,), k, device="cuda")
    return lambda x: reduce_logprobs(x, token_ids, num_top, k, out=out)


def eager_step(n_rows: int, k: int):
    token_ids = torch.randint(0, VOCAB, (n_rows, 1), device="cuda")

    def step(x: torch.Tensor):
        logprobs = torch.log_softmax(x.float(), dim=-1)
        selected = logprobs.gather(1, token_ids)
        return (selected, logprobs.topk(k, dim=-1)) if k else selected

    return step


def host_us_per_call(x: torch.Tensor, k: int, repeats: int = 3) -> float:
    """Wall-clock µs for the host path over all rows of x (copy each row, float64 reference)."""
    tokens = torch.randint(0, VOCAB, (x.shape[0],)).tolist()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i, token in enumerate(tokens):
            token_logprob_from_row(x[i].cpu(), token, k)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def measure(
    dtype_name: str, inputs: list[torch.Tensor], k: int, copy_bw: float, config: ReduceConfig, host: bool
) -> dict:
    n_rows = inputs[0].shape[0]
    logits_bytes = n_rows * VOCAB * inputs[0].element_size()
    reduce_us = graph_us_per_call(reduce_step(n_rows, k, config), inputs)
    eager_us = graph_us_per_call(eager_step(n_rows, k), inputs)
    return {
        "dtype": dtype_name,
        "n_rows": n_rows,
        "k": k,
        "reduce_us": reduce_us,
        "floor_us": logits_bytes / copy_bw * 1e6,
        "achieved_tb_s": logits_bytes / (reduce_us * 1e-6) / 1e12,
        "eager_us": eager_us,
        "speedup_vs_eager": eager_us / reduce_us,
        "host_us": host_us_per_call(inputs[0], k) if host else None,
    }


def markdown(rows: list[dict], copy_bw: float) -> str:
    lines = [
        f"Device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write). µs per call, V = {VOCAB}.",
        "",
        "| logits | N | k | reduce µs | floor µs | achieved TB/s | eager PyTorch µs | speedup | host µs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        host = f"{r['host_us']:.0f}" if r["host_us"] is not None else "-"
        lines.append(
            f"| {r['dtype']} | {r['n_rows']} | {r['k']} | {r['reduce_us']:.1f} | {r['floor_us']:.2f} | "
            f"{r['achieved_tb_s']:.2f} | {r['eager_us']:.1f} | {r['speedup_vs_eager']:.1f}x | {host} |"
        )
    return "\n".join(lines) + "\n"


def sweep_markdown(rows: list[dict]) -> str:
    lines = ["| config | logits | N | k | reduce µs |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['dtype']} | {r['n_rows']} | {r['k']} | {r['reduce_us']:.1f} |")
    return "\n".join(lines) + "\n"


def _compile(variants: list[tuple[ReduceConfig, str, int]]) -> None:
    """Worker: run each variant once on one row, filling Triton's on-disk kernel cache."""
    for config, dtype_name, k in variants:
        reduce_step(1, k, config)(torch.zeros(1, VOCAB, dtype=DTYPES[dtype_name], device="cuda"))
    torch.cuda.synchronize()


def precompile(variants: list[tuple[ReduceConfig, str, int]], jobs: int) -> None:
    """Compile the kernels in parallel processes: serially, compiling dominates a sweep's run time."""
    batches = [variants[i::jobs] for i in range(jobs) if variants[i::jobs]]
    with ProcessPoolExecutor(len(batches), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, batches))


def run_sweep(sizes: list[int]) -> list[dict]:
    rows = []
    for dtype_name, dtype in DTYPES.items():
        for n_rows in sizes:
            inputs = rotating_inputs(n_rows, dtype)
            for config in SWEEP:
                for k in (0, 5, 20):
                    us = graph_us_per_call(reduce_step(n_rows, k, config), inputs)
                    rows.append(
                        {"config": str(asdict(config)), "dtype": dtype_name, "n_rows": n_rows, "k": k, "reduce_us": us}
                    )
                    print(sweep_markdown(rows[-1:]).splitlines()[-1], flush=True)
            del inputs
    return rows


def kernel_breakdown(n_rows: int, k: int, config: ReduceConfig) -> dict[str, float]:
    """Mean device µs of each kernel of one call (profiled eagerly, so launch gaps are excluded)."""
    from torch.profiler import ProfilerActivity, profile

    step = reduce_step(n_rows, k, config)
    x = realistic_logits(n_rows, torch.float32)
    step(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step(x)
        torch.cuda.synchronize()
    return {e.key: e.self_device_time_total / e.count for e in prof.key_averages() if e.self_device_time_total > 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for reduce.json and reduce.md")
    parser.add_argument("--quick", action="store_true", help="a subset (< 1 min)")
    parser.add_argument("--sweep", action="store_true", help="also compare the SWEEP configs at N = 32 and 256")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="parallel compiles")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=INT",
        help="override a ReduceConfig field for the main table, e.g. --set finish_warps=8",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    overrides = {field: int(value) for field, value in (item.split("=", 1) for item in args.set)}
    config = replace(ReduceConfig(), **overrides)
    sizes = [1, 32, 256] if args.quick else [1, 8, 32, 256, 1024]
    ks = [0, 5, 20] if args.quick else [0, 1, 5, 20]
    sweep_sizes = [32, 256] if args.sweep else []
    variants = [(config, d, k) for d in DTYPES for k in ks]
    variants += [(c, d, k) for c in SWEEP for d in DTYPES for k in (0, 5, 20) if sweep_sizes]
    precompile(variants, args.jobs)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    meta = {
        **environment(),
        "vocab": VOCAB,
        "config": asdict(config),
        "copy_bandwidth_bytes_s": copy_bw,
    }
    report = {"results": [], "sweep": [], "kernel_breakdown": []}

    def save() -> str:
        """Write what is measured so far (a run cut short still leaves its figures)."""
        table = markdown(report["results"], copy_bw)
        if report["sweep"]:
            table += "\nConfig sweep:\n\n" + sweep_markdown(report["sweep"])
        if report["kernel_breakdown"]:
            table += (
                "\nKernel breakdown (default config, fp32, µs per kernel):\n\n"
                + "\n".join(
                    f"- N={b['n_rows']} k={b['k']}: "
                    + ", ".join(f"{name} {us:.1f}" for name, us in b["kernel_us"].items())
                    for b in report["kernel_breakdown"]
                )
                + "\n"
            )
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reduce.json").write_text(json.dumps({**meta, **report}, indent=1))
        (args.out / "reduce.md").write_text(table)
        return table

    if args.sweep:
        report["kernel_breakdown"] = [
            {"n_rows": n, "k": k, "dtype": "fp32", "kernel_us": kernel_breakdown(n, k, config)}
            for n in (1, 32, 256)
            for k in (0, 20)
        ]
        report["sweep"] = run_sweep(sweep_sizes)
        save()
    for dtype_name, dtype in DTYPES.items():
        for n_rows in sizes:
            inputs = rotating_inputs(n_rows, dtype)
            for k in ks:
                report["results"].append(measure(dtype_name, inputs, k, copy_bw, config, host=n_rows <= 32))
                print(markdown(report["results"][-1:], copy_bw).splitlines()[-1], flush=True)
            del inputs
            save()
    print(save())


if __name__ == "__main__":
    main()
