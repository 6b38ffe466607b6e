"""Issue 33's re-measurement: how many sampled tokens fall outside the processed support (top-k /
top-p), counted through the public API as tokens whose processed logprob is not finite. The reporter's
setting: Qwen3-0.6B shape (V = 151,936) with random weights, 64 prompts x 8 rounds x 32 tokens,
temperature 0.7, top-k 20, top-p 0.8, a distinct seed per request.

Usage: python -m scripts.sampling_check [--config tiny --rounds 1] --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from qwen3_runtime import Runtime, SamplingParams
from scripts.report import environment


def check(rt: Runtime, prompts: int, rounds: int, prompt_len: int, max_tokens: int, sampling: dict) -> dict:
    """Counts over every sampled token: total, outside the support (processed logprob -inf), NaN or
    +inf logprobs, missing logprobs, ranks beyond top-k, and failed requests."""
    counts = dict.fromkeys(("tokens", "outside_support", "nan", "pos_inf", "missing", "rank_over_top_k", "errors"), 0)
    rng = np.random.default_rng(33)
    for r in range(rounds):
        batch = rng.integers(0, rt.vocab_size, (prompts, prompt_len)).tolist()
        params = [SamplingParams(max_tokens=max_tokens, seed=r * prompts + i, **sampling) for i in range(prompts)]
        for out in rt.generate(batch, params):
            if out.error:
                counts["errors"] += 1
                continue
            for token, lp in zip(out.token_ids, out.logprobs):
                counts["tokens"] += 1
                if lp is None:
                    counts["missing"] += 1
                    continue
                assert lp.token_id == token
                counts["outside_support"] += lp.logprob == -math.inf
                counts["nan"] += math.isnan(lp.logprob)
                counts["pos_inf"] += lp.logprob == math.inf
                counts["rank_over_top_k"] += sampling["top_k"] > 0 and lp.rank > sampling["top_k"]
        print(f"round {r + 1}/{rounds}: {counts}", flush=True)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-0.6b")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    overrides = {"engine.max_model_len": 512, "engine.max_num_seqs": args.prompts}
    rt = Runtime.from_yaml(args.config, overrides=overrides)
    sampling = {
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
        "logprobs": 0,
        "logprobs_mode": "processed",
        "ignore_eos": True,
    }
    counts = check(rt, args.prompts, args.rounds, args.prompt_len, args.max_tokens, sampling)
    bad = counts["outside_support"] + counts["nan"] + counts["pos_inf"]
    print(f"sampled tokens outside the processed support: {bad} of {counts['tokens']}")
    result = {
        "config": args.config,
        "vocab_size": rt.vocab_size,
        "prompts": args.prompts,
        "rounds": args.rounds,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "sampling": sampling,
        "counts": counts,
        "outside_support_fraction": bad / max(counts["tokens"], 1),
        **environment(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sampling_check.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
