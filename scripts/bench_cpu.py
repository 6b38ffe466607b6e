"""What logprobs and filtered sampling cost on the CPU: the tiny model (configs/tiny.yaml), a batch of a few
prompts decoded together, TPOT with logprobs off / 0 / 5 / 20 (greedy) and sampled at temperature 0.7 without a
filter, with top-p and with top-k, each as a ratio to logprobs off. The settings take turns run by run, so drift
in the machine's speed hits them alike.

Usage: python scripts/bench_cpu.py [--threads 1] [--repeats 5] [--prompts 4] [--tokens 32]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics

import numpy as np

from qwen3_runtime import Runtime, SamplingParams

SETTINGS = {
    "logprobs off": {},
    "logprobs=0": {"logprobs": 0},
    "logprobs=5": {"logprobs": 5},
    "logprobs=20": {"logprobs": 20},
    "sampled": {"temperature": 0.7, "seed": 1},  # what top-p and top-k add to: the noise costs the most
    "top-p 0.8": {"temperature": 0.7, "top_p": 0.8, "seed": 1},
    "top-k 20": {"temperature": 0.7, "top_k": 20, "seed": 1},
}


def tpot_ms(rt: Runtime, prompts: list[list[int]], params: SamplingParams) -> float:
    """The median request's TPOT (ms) of one batch run to completion, from a collected heap."""
    gc.collect()
    return 1e3 * statistics.median(out.tpot for out in rt.generate(prompts, params))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="engine.cpu_threads")
    parser.add_argument("--repeats", type=int, default=5, help="runs per setting (medians)")
    parser.add_argument("--prompts", type=int, default=4, help="requests decoded together")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    args = parser.parse_args()
    # No prefix cache: every run repeats the same prompts, and a hit would spare the later runs' prefill.
    overrides = {"engine.device": "cpu", "engine.prefix_caching": False, "engine.cpu_threads": args.threads}
    rt = Runtime.from_yaml("tiny", overrides=overrides)
    prompts = np.random.default_rng(0).integers(0, rt.vocab_size, (args.prompts, 16)).tolist()
    params = {
        name: SamplingParams(**{"max_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True, **fields})
        for name, fields in SETTINGS.items()
    }
    for p in params.values():  # warm-up
        rt.generate(prompts, dataclasses.replace(p, max_tokens=2))
    runs: dict[str, list[float]] = {name: [] for name in params}
    for r in range(args.repeats):
        names = list(params)[r % len(params) :] + list(params)[: r % len(params)]
        for name in names:
            runs[name].append(tpot_ms(rt, prompts, params[name]))
    off = statistics.median(runs["logprobs off"])
    print(f"tiny model, CPU, {args.threads} thread(s), {args.prompts} x {args.tokens} tokens, {args.repeats} runs")
    print(f"{'setting':14s} {'TPOT ms':>8s} {'min-max':>13s} {'x off':>6s}")
    for name, ms in runs.items():
        median = statistics.median(ms)
        print(f"{name:14s} {median:8.2f} {min(ms):6.2f}-{max(ms):6.2f} {median / off:6.2f}")


if __name__ == "__main__":
    main()
