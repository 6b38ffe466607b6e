"""Decode speed: TPOT of greedy generation per batch size (random weights of a real Qwen3 shape), beside
the weight-read floor, each batch's step floor (weights and K/V read at the larger of the copy and read
bandwidths, or the FLOPs at the large-matmul rate, whichever is longer) and Hugging Face transformers'
static-cache `generate`, all measured in this run. For a MoE model the weights a step reads are those of the experts
its rows route to, counted on the device first (scripts/routed_experts.py).

Usage: python -m scripts.bench_decode --config qwen3-4b --batch 1 8 32 64 [--quick]
    [--sampling greedy temperature filtered] --out DIR

--sampling: the requests' sampling, each measured on the same runtime; rows of a non-greedy one are
labelled "<mode> <sampling>" (e.g. "graph-async temperature"), so greedy rows keep their plain mode.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from qwen3_runtime import Runtime, SamplingParams
from qwen3_runtime.config import load_config
from scripts.floors import decode_step_floor_s, expert_bytes, routed_weight_bytes, weight_bytes
from scripts.hf_reference import random_hf_model, static_cache_tpot
from scripts.report import environment
from scripts.routed_experts import routed_experts
from scripts.timing import matmul_rate, stream_bandwidths

# temperature: the unfiltered random graph variant; filtered: top-k selection; top_p: top-p alone's rounds after
# the Gumbel pass; min_p: no filter.
SAMPLING = {
    "greedy": {"temperature": 0},
    "temperature": {"temperature": 1.0},
    "filtered": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
    "top_p": {"temperature": 0.7, "top_p": 0.8},
    # greedy with the penalties users send, a logit_bias of 32 tokens spread over the vocabulary among them: the
    # penalized graph variant's extra pass over the logits
    "penalized": {
        "temperature": 0,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.2,
        "presence_penalty": 0.2,
        "logit_bias": dict.fromkeys(range(7, 151_936, 4_748), -0.5),
    },
    "min_p": {"temperature": 1.0, "min_p": 0.05},
}


def measure_tpot(
    rt: Runtime, batch: int, prompt_len: int, max_tokens: int, seed: int = 0, sampling: str = "greedy"
) -> dict:
    """The batch's requests admitted in one prefill, then decoded together. TPOT: a request's (last token -
    first token) / (tokens - 1), the median over requests; ITL: the median gap between consecutive steps'
    tokens reaching the host, as a streaming client sees them. transformers is timed the same way."""
    prompts = np.random.default_rng(seed).integers(0, rt.vocab_size, (batch, prompt_len)).tolist()
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **SAMPLING[sampling])
    start = time.perf_counter()
    for prompt in prompts:
        rt.add_request(prompt, params)
    outs, token_times = [], []
    while rt.has_unfinished():
        before = rt.num_generated
        outs += rt.step()
        if rt.num_generated > before:
            token_times.append(time.perf_counter())
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return {
        "batch": batch,
        "tpot_ms": 1e3 * statistics.median(o.tpot for o in outs),
        "itl_ms": 1e3 * statistics.median(b - a for a, b in zip(token_times[1:], token_times[2:])),
        "ttft_ms": 1e3 * statistics.median(o.ttft for o in outs),
        "tokens_per_s": tokens / wall,
    }


def ours(args: argparse.Namespace, mode: str) -> tuple[list[dict], int]:
    rt = Runtime.from_yaml(
        args.config,
        overrides={
            # Long prompts (--prompt-len) measure long-context decode, the long rows' graphs included.
            "engine.max_model_len": max(1024, args.prompt_len + args.max_tokens),
            "engine.max_num_seqs": max(args.batch),
            "engine.cuda_graphs": mode != "eager",
            "engine.async_scheduling": mode == "graph-async",
        },
    )
    measure_tpot(rt, 2, 16, 4)  # warm-up: Triton compilation, allocator
    graphs = len(rt.runner.graphs.graphs)
    print(f"{args.config} {mode}: {graphs} CUDA graphs captured in {rt.runner.stats.capture_s:.1f} s", flush=True)
    rows, warmed = [], set()
    for batch, sampling in itertools.product(args.batch, args.sampling):
        if batch not in warmed:  # the first mode at a batch size would pay the Triton compilations of its shapes
            measure_tpot(rt, batch, args.prompt_len, 4)
            warmed.add(batch)
        runs = [
            measure_tpot(rt, batch, args.prompt_len, args.max_tokens, seed=r, sampling=sampling)
            for r in range(args.repeats)
        ]
        label = mode if sampling == "greedy" else f"{mode} {sampling}"
        stats = {"graphs": graphs, "capture_s": rt.runner.stats.capture_s, "sampling": sampling}
        context = args.prompt_len + args.max_tokens // 2  # the mean over the run
        step_bytes = weight_bytes(rt.model)
        if batch in args.routed:  # a MoE model: the experts its rows route to
            step_bytes = routed_weight_bytes(step_bytes, expert_bytes(rt.model), args.routed[batch])
            stats |= {"routed_experts": args.routed[batch], "step_weight_bytes": step_bytes}
        floor = decode_step_floor_s(
            rt.model.config, step_bytes, batch, context, rt.dtype.itemsize, args.bandwidth, args.rate
        )
        medians = _medians(runs)
        # Where the batch's prompts take several prefill steps, its requests' TPOT holds those steps; ITL, the
        # median time between steps, is then the decode step's time.
        stats |= {
            "step_floor_ms": 1e3 * floor,
            "vs_step_floor": medians["tpot_ms"] / (1e3 * floor),
            "itl_vs_step_floor": medians["itl_ms"] / (1e3 * floor),
        }
        rows.append({"mode": label, **medians, **stats})
        print(
            f"{args.config} {label} batch {batch:3d}: TPOT {rows[-1]['tpot_ms']:.2f} ms  ITL {rows[-1]['itl_ms']:.2f} "
            f"ms  TTFT {rows[-1]['ttft_ms']:.1f} ms  {rows[-1]['tokens_per_s']:.0f} tok/s  step floor "
            f"{rows[-1]['step_floor_ms']:.2f} ms (TPOT x{rows[-1]['vs_step_floor']:.2f}, ITL "
            f"x{rows[-1]['itl_vs_step_floor']:.2f})",
            flush=True,
        )
    nbytes = weight_bytes(rt.model)
    del rt
    gc.collect()
    torch.cuda.empty_cache()
    return rows, nbytes


def transformers_static(args: argparse.Namespace) -> Iterator[dict]:
    """A row per batch size, as it is measured (compiling for each batch size takes a while)."""
    model = random_hf_model(load_config(args.config).model.architecture)
    for batch in args.hf_batch:
        # Compilation and CUDA-graph capture, at the measured shape: the static cache's length is prompt + new
        # tokens, and a shorter warm-up leaves a recompilation inside the first measured run.
        static_cache_tpot(model, batch, args.prompt_len, args.max_tokens)
        runs = [static_cache_tpot(model, batch, args.prompt_len, args.max_tokens, seed=r) for r in range(args.repeats)]
        row = {"mode": "transformers static cache", "batch": batch, **_medians(runs)}
        print(
            f"transformers static cache batch {batch:3d}: TPOT {row['tpot_ms']:.2f} ms  ITL {row['itl_ms']:.2f} ms",
            flush=True,
        )
        yield row
    del model
    gc.collect()
    torch.cuda.empty_cache()


def _medians(runs: list[dict]) -> dict:
    """Each figure's median over the repetitions, and every repetition's TPOT (transformers' TPOT spreads
    by several percent from one generate call to the next)."""
    return {**{k: statistics.median(r[k] for r in runs) for k in runs[0]}, "tpot_ms_runs": [r["tpot_ms"] for r in runs]}


def write_result(args: argparse.Namespace, rows: list[dict], hf_rows: list[dict], nbytes: int) -> None:
    """decode.json with every row so far and the ratios they allow, rewritten as rows arrive: a run
    stopped by a time limit keeps what it measured."""
    floor_ms = 1e3 * nbytes / args.bandwidths["bandwidth_bytes_s"]
    for row in rows + hf_rows:
        row["vs_floor"] = row["tpot_ms"] / floor_ms
    for row, (mode, key) in itertools.product(
        hf_rows, (("graph", "speedup_of_ours"), ("graph-async", "speedup_of_async"))
    ):
        ours_row = next((r for r in rows if r["mode"] == mode and r["batch"] == row["batch"]), None)
        if ours_row:
            row[key] = row["tpot_ms"] / ours_row["tpot_ms"]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "config": args.config,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "weight_bytes": nbytes,
        **args.bandwidths,
        "floor_ms": floor_ms,
        "rows": rows + hf_rows,
        **environment(),
    }
    (args.out / "decode.json").write_text(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-4b")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument(
        "--hf-batch", type=int, nargs="*", default=[1, 8, 32], help="batch sizes for transformers (none: skip it)"
    )
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["graph-async", "graph", "eager"],
        choices=["graph", "graph-async", "eager"],
        help="graph-async: CUDA graphs with async scheduling (the engine's default); graph: CUDA "
        "graphs, synchronous steps; eager: neither",
    )
    parser.add_argument(
        "--sampling",
        nargs="+",
        default=["greedy"],
        choices=list(SAMPLING),
        help="greedy; temperature: 1.0; filtered: temperature 0.7, top-p 0.8, top-k 20; top_p: the same without "
        "top-k; penalized: greedy with "
        "repetition 1.1, frequency 0.2, presence 0.2, a logit_bias of 32 tokens; min_p: temperature 1.0, min-p 0.05",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="32 tokens, one repetition, graph-async mode only, transformers at the first --hf-batch only",
    )
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if args.quick:
        args.max_tokens, args.repeats, args.modes, args.hf_batch = 32, 1, ["graph-async"], args.hf_batch[:1]
    args.bandwidths = stream_bandwidths()
    bandwidth = args.bandwidth = args.bandwidths["bandwidth_bytes_s"]
    args.rate = matmul_rate()
    args.routed = {}
    if hasattr(load_config(args.config).model.architecture, "num_experts"):
        args.routed = routed_experts(args.config, args.batch, args.prompt_len, 8, max(args.batch))
        print(f"distinct experts routed per decode step (all sparse layers): {args.routed}", flush=True)
    rows = []
    for mode in args.modes:
        mode_rows, nbytes = ours(args, mode)
        rows += mode_rows
    print(
        f"weight-read floor: {nbytes / 1e9:.2f} GB / {bandwidth / 1e12:.2f} TB/s (copy "
        f"{args.bandwidths['copy_bandwidth_bytes_s'] / 1e12:.2f}, read {args.bandwidths['read_bandwidth_bytes_s'] / 1e12:.2f}"
        f") = {1e3 * nbytes / bandwidth:.3f} ms",
        flush=True,
    )
    hf_rows: list[dict] = []
    write_result(args, rows, hf_rows, nbytes)
    for row in transformers_static(args) if args.hf_batch else []:
        hf_rows.append(row)
        write_result(args, rows, hf_rows, nbytes)
    for row, (mode, key) in itertools.product(
        hf_rows, (("graph", "speedup_of_ours"), ("graph-async", "speedup_of_async"))
    ):
        if key in row:
            print(
                f"batch {row['batch']}: ours ({mode}) {row['tpot_ms'] / row[key]:.2f} ms vs transformers "
                f"{row['tpot_ms']:.2f} ms = {row[key]:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    main()
