"""Decode speed: TPOT of greedy generation per batch size, with random weights of a real Qwen3 shape.

Usage: python -m scripts.bench_decode --config qwen3-4b --batch 1 32 --out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from qwen3_runtime import Runtime, SamplingParams
from scripts.report import environment


def measure_tpot(rt: Runtime, batch: int, prompt_len: int, max_tokens: int, seed: int = 0) -> dict:
    """Median TPOT (ms) over the batch's requests, all admitted in one prefill, then decoded together."""
    prompts = np.random.default_rng(seed).integers(0, rt.vocab_size, (batch, prompt_len)).tolist()
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outs = rt.generate(prompts, params)
    wall = time.perf_counter() - start
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.token_ids) - 1) for o in outs]
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    tokens = sum(len(o.token_ids) for o in outs)
    return {"batch": batch, "tpot_ms": 1e3 * statistics.median(tpot), "ttft_ms": 1e3 * statistics.median(ttft),
            "tokens_per_s": tokens / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-4b")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["graph", "eager"], choices=["graph", "eager"])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    rows = []
    for mode in args.modes:
        rt = Runtime.from_yaml(args.config, overrides={
            "engine.max_model_len": 1024, "engine.max_num_seqs": max(args.batch),
            "engine.cuda_graphs": mode == "graph"})
        measure_tpot(rt, 2, 16, 4)  # warm-up: Triton compilation, allocator
        for batch in args.batch:
            runs = [measure_tpot(rt, batch, args.prompt_len, args.max_tokens, seed=r) for r in range(args.repeats)]
            row = {"mode": mode, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
            rows.append(row)
            print(f"{args.config} {mode} batch {batch:3d}: TPOT {row['tpot_ms']:.2f} ms  "
                  f"TTFT {row['ttft_ms']:.1f} ms  {row['tokens_per_s']:.0f} tok/s", flush=True)
        del rt
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"config": args.config, "prompt_len": args.prompt_len,
              "max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows, **environment()}
    (args.out / "decode.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    main()
