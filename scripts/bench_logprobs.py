"""The before/after matrix: what logprobs cost on the host path (full rows, float64 scan) and on the
device path (reduction inside the captured step), Qwen3-4B shape with random bf16 weights, greedy.

Usage: python -m scripts.bench_logprobs [--quick] --out DIR
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from qwen3_runtime import Runtime, SamplingParams
from scripts.profiling import profile_steps
from scripts.report import environment


def _prompts(rt: Runtime, count: int, length: int, seed: int) -> list[list[int]]:
    return np.random.default_rng(seed).integers(0, rt.vocab_size, (count, length)).tolist()


def _run(rt: Runtime, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    """Per-request TPOT (ms) and output tokens/s of one batch run to completion, from a collected heap
    (garbage left by the previous run would otherwise be collected during this one)."""
    gc.collect()
    start = time.perf_counter()
    outs = rt.generate(prompts, params)
    wall = time.perf_counter() - start
    return {"tpot_ms": [1e3 * o.tpot for o in outs], "tokens_per_s": sum(len(o.token_ids) for o in outs) / wall}


def matrix(
    runtimes: dict[str, Runtime], concurrency: list[int], prompt_len: int, max_tokens: int, repeats: int
) -> list[dict]:
    """TPOT per (concurrency, logprobs, path). At each concurrency the settings take turns run by run,
    each repetition starting one setting later, so drift in the machine's speed and what a run
    leaves behind land on every setting alike."""
    settings = [(None, next(iter(runtimes)))] + [(k, path) for k in (1, 5) for path in runtimes]  # off: same step
    rows = []
    for c in concurrency:
        runs: dict = {setting: [] for setting in settings}
        for r in range(repeats):
            for k, path in settings[r % len(settings) :] + settings[: r % len(settings)]:
                params = [SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=k)] * c
                runs[(k, path)].append(_run(runtimes[path], _prompts(runtimes[path], c, prompt_len, r), params))
        for (k, path), setting_runs in runs.items():
            rows.append(
                {
                    "concurrency": c,
                    "logprobs": k,
                    "path": path if k is not None else "-",
                    "tpot_ms": statistics.median(statistics.median(r["tpot_ms"]) for r in setting_runs),
                    "tokens_per_s": statistics.median(r["tokens_per_s"] for r in setting_runs),
                }
            )
            print(
                f"c={c:2d} logprobs={str(k):4s} {rows[-1]['path']:6s}: TPOT {rows[-1]['tpot_ms']:.2f} ms, "
                f"{rows[-1]['tokens_per_s']:.0f} tok/s",
                flush=True,
            )
    for row in rows:  # ratios against logprobs off, inside this run
        off = next(r for r in rows if r["concurrency"] == row["concurrency"] and r["logprobs"] is None)
        row["tpot_vs_off"] = row["tpot_ms"] / off["tpot_ms"]
    return rows


def mixed(runtimes: dict[str, Runtime], prompt_len: int, max_tokens: int, repeats: int) -> list[dict]:
    """Concurrency 8 with exactly one logprobs=5 request: what the other seven rows pay. The two
    batches alternate run by run, so drift in the machine's speed hits both alike."""
    rows = []
    for path, rt in runtimes.items():
        base = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        one = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=5)
        batches = {"all off": [base] * 8, "one logprobs=5": [one] + [base] * 7}
        runs = {label: [] for label in batches}
        for r in range(repeats):
            for label, params in batches.items():
                runs[label].append(_run(rt, _prompts(rt, 8, prompt_len, r), params))
        for label, label_runs in runs.items():
            rows.append(
                {
                    "path": path,
                    "batch": label,
                    "others_tpot_ms": statistics.median(statistics.median(r["tpot_ms"][1:]) for r in label_runs),
                    "tokens_per_s": statistics.median(r["tokens_per_s"] for r in label_runs),
                }
            )
            print(
                f"mixed {path:6s} {label:15s}: other rows' TPOT {rows[-1]['others_tpot_ms']:.2f} ms, "
                f"{rows[-1]['tokens_per_s']:.0f} tok/s",
                flush=True,
            )
    return rows


def prompt_logprobs(runtimes: dict[str, Runtime], length: int, repeats: int) -> list[dict]:
    """Prefill time of one prompt with and without prompt logprobs, alternating, after one warm-up each.
    Three times `repeats` pairs: the difference measured is about the size of one slow call."""
    rows = []
    for path, rt in runtimes.items():
        prompt = _prompts(rt, 1, length, 7)
        times: dict = {None: [], 5: []}
        for _ in range(3 * repeats + 1):
            for k in times:
                torch.cuda.synchronize()
                start = time.perf_counter()
                rt.generate(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k))
                times[k].append(1e3 * (time.perf_counter() - start))
        for k, ms in times.items():
            rows.append(
                {
                    "path": path,
                    "prompt_logprobs": k,
                    "prompt_len": length,
                    "prefill_ms": statistics.median(ms[1:]),
                    "calls": len(ms) - 1,
                }
            )
            print(f"prompt logprobs={k} {path}: prefill {rows[-1]['prefill_ms']:.1f} ms", flush=True)
    return rows


def copies_per_step(runtimes: dict[str, Runtime], concurrency: int, steps: int = 16) -> list[dict]:
    rows = []
    for path, rt in runtimes.items():
        for k in (None, 5):
            for prompt in _prompts(rt, concurrency, 128, 0):
                rt.add_request(prompt, SamplingParams(max_tokens=steps + 4, temperature=0, ignore_eos=True, logprobs=k))
            rt.step()  # the prefill
            copies, syncs = profile_steps(rt, steps)
            while rt.has_unfinished():
                rt.step()
            rows.append(
                {
                    "path": path,
                    "logprobs": k,
                    "concurrency": concurrency,
                    "d2h_copies_per_step": len(copies) / steps,
                    "d2h_bytes_per_step": sum(copies) / steps,
                    "host_syncs_per_step": syncs / steps,
                }
            )
            print(
                f"profiler {path} logprobs={k} c={concurrency}: {rows[-1]['d2h_copies_per_step']:.1f} copies, "
                f"{rows[-1]['d2h_bytes_per_step']:.0f} bytes, {rows[-1]['host_syncs_per_step']:.1f} syncs per step",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-4b")
    parser.add_argument("--quick", action="store_true", help="fewer tokens and one repetition")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions (medians); --quick makes it 1")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["matrix", "mixed", "prompt", "copies"],
        choices=["matrix", "mixed", "prompt", "copies"],
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="of the matrix")
    parser.add_argument("--paths", nargs="+", default=["device", "host"], choices=["device", "host"])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    max_tokens, repeats = (64, 1) if args.quick else (256, args.repeats)
    # No prefix cache: the settings repeat the same prompts, and a hit would spare one setting's prefill but not
    # another's (prompt logprobs recompute every position).
    overrides = {
        "engine.max_model_len": 2048,
        "engine.max_num_seqs": 32,
        "engine.gpu_memory_utilization": 0.4,
        "engine.prefix_caching": False,
    }
    runtimes = {
        path: Runtime.from_yaml(args.config, overrides={**overrides, "logprobs.path": path}) for path in args.paths
    }
    for rt in runtimes.values():  # warm-up
        rt.generate(_prompts(rt, 2, 16, 0), SamplingParams(max_tokens=4, temperature=0, logprobs=5))
    parts = {
        "matrix": lambda: matrix(runtimes, args.concurrency, 128, max_tokens, repeats),
        "mixed": lambda: mixed(runtimes, 128, max_tokens, repeats),
        "prompt": lambda: prompt_logprobs(runtimes, 1024, repeats),
        "copies": lambda: copies_per_step(runtimes, 8),
    }
    result = {
        "config": args.config,
        "prompt_len": 128,
        "max_tokens": max_tokens,
        "repeats": repeats,
        **{name: parts[name]() for name in args.parts},
        **environment(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logprobs.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
