"""What structured outputs cost a decode batch (issue 71's targets), Qwen3-4B shape with random weights, prompts of
128 random tokens, every request sampled at temperature 1 with its own seed:

- all: concurrency C (32) with every request constrained by a JSON schema against none: TPOT and the ratio;
- one: one constrained request among C: the C - 1 others' TPOT against the same rows of a run with none;
- compile: the schema's compile time at its first use (after the engine's one-time tokenizer and xgrammar set-up,
  reported apart) and its second use (the cache).

With random weights the model's tokens are noise and the grammar decides the output. The schema's strings are long
enough that a random model rarely closes them before the grammar's bounds, so the outputs run to max_tokens through
keys, strings, an integer, an enum and an array; TPOT is over the tokens each request produced. The three batches
take turns run by run, each repetition starting one later, so drift in the machine's speed lands on all alike.

Usage: python -m scripts.bench_constrained [--config qwen3-4b] [--concurrency 32] [--max-tokens 48]
    [--repeats 5] [--set KEY=VALUE ...] --out DIR
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
from qwen3_runtime.config import parse_override
from qwen3_runtime.structured import OutputConstraint
from scripts.report import environment

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 8},
        "bio": {"type": "string", "maxLength": 400},
    },
    "required": ["name", "age", "color", "tags", "bio"],
}
BATCHES = ("none", "one", "all")  # constrained requests: none, the first alone, every one
PARTS = ("batches", "compile")


def _prompts(rt: Runtime, count: int, length: int, seed: int) -> list[list[int]]:
    return np.random.default_rng(seed).integers(0, rt.vocab_size, (count, length)).tolist()


def _params(batch: str, count: int, max_tokens: int, seed: int) -> list[SamplingParams]:
    constraint = OutputConstraint.json_schema(PERSON)
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0,
            seed=seed * count + i,
            ignore_eos=True,
            constraint=constraint if batch == "all" or (batch == "one" and i == 0) else None,
        )
        for i in range(count)
    ]


def _run(rt: Runtime, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    """One batch run to completion, from a collected heap: each request's TPOT (ms) and tokens, output tokens/s,
    and the device-to-host copies and host waits per step."""
    gc.collect()
    stats = rt.stats
    before = (stats.decode_steps + stats.prefill_steps, stats.d2h_copies, stats.host_syncs)
    start = time.perf_counter()
    outs = rt.generate(prompts, params)
    wall = time.perf_counter() - start
    if any(o.error for o in outs):
        raise RuntimeError(f"a request failed: {next(o.error for o in outs if o.error)}")
    steps = stats.decode_steps + stats.prefill_steps - before[0]
    return {
        "tpot_ms": [1e3 * o.tpot for o in outs],
        "tokens": [len(o.token_ids) for o in outs],
        "tokens_per_s": sum(len(o.token_ids) for o in outs) / wall,
        "copies_per_step": (stats.d2h_copies - before[1]) / steps,
        "syncs_per_step": (stats.host_syncs - before[2]) / steps,
    }


def batches(rt: Runtime, args: argparse.Namespace) -> dict:
    """TPOT of each batch (the median over runs of the median over its requests), and the ratios of the issue's
    targets: all constrained against none, and the others beside one constrained request against the same rows
    of a run with none."""
    runs: dict[str, list[dict]] = {batch: [] for batch in BATCHES}
    c = args.concurrency
    for r in range(args.repeats):
        prompts = _prompts(rt, c, args.prompt_len, r)
        for batch in BATCHES[r % 3 :] + BATCHES[: r % 3]:
            runs[batch].append(_run(rt, prompts, _params(batch, c, args.max_tokens, r)))
    rows = {}
    for batch, batch_runs in runs.items():
        rows[batch] = {
            "constrained": {"none": 0, "one": 1, "all": c}[batch],
            "tpot_ms": statistics.median(statistics.median(run["tpot_ms"]) for run in batch_runs),
            "others_tpot_ms": statistics.median(statistics.median(run["tpot_ms"][1:]) for run in batch_runs),
            "tokens_per_s": statistics.median(run["tokens_per_s"] for run in batch_runs),
            "mean_tokens": statistics.fmean(t for run in batch_runs for t in run["tokens"]),
            "at_max_tokens": statistics.fmean(t == args.max_tokens for run in batch_runs for t in run["tokens"]),
            "copies_per_step": max(run["copies_per_step"] for run in batch_runs),
            "syncs_per_step": max(run["syncs_per_step"] for run in batch_runs),
        }
    return {
        "concurrency": c,
        "rows": rows,
        "all_vs_none_tpot": rows["all"]["tpot_ms"] / rows["none"]["tpot_ms"],
        "one_others_vs_none_tpot": rows["one"]["others_tpot_ms"] / rows["none"]["others_tpot_ms"],
    }


def compile_times(rt: Runtime, prompt: list[int]) -> dict:
    """Through the engine's request path, before any other constraint: the first constrained request's set-up (the
    tokenizer and xgrammar's view of the vocabulary, once per engine), then the schema's compile in the worker
    thread at its first use and its second (the cache)."""
    params = SamplingParams(max_tokens=1, constraint=OutputConstraint.json_schema(PERSON))
    start = time.perf_counter()
    first = rt.add_request(prompt, params)
    submitted = time.perf_counter()
    rt._live[first].grammar.result()
    compiled = time.perf_counter()
    second = rt.add_request(prompt, params)
    queued = time.perf_counter()  # the wait for its grammar alone: the request's own set-up is not the compile's
    rt._live[second].grammar.result()
    cached = time.perf_counter()
    while rt.has_unfinished():
        rt.step()
    return {
        "engine_setup_ms": 1e3 * (submitted - start),
        "compile_first_ms": 1e3 * (compiled - submitted),
        "compile_cached_ms": 1e3 * (cached - queued),
    }


def show(result: dict) -> None:
    if "compile" in result:
        part = result["compile"]
        print(
            f"compile: engine set-up {part['engine_setup_ms']:.0f} ms (once), schema {part['compile_first_ms']:.1f} ms"
            f" first use, {part['compile_cached_ms']:.3f} ms cached",
            flush=True,
        )
    if "batches" in result:
        part = result["batches"]
        for row in part["rows"].values():
            print(
                f"c={part['concurrency']} constrained={row['constrained']:2d}: TPOT {row['tpot_ms']:.2f} ms "
                f"(others {row['others_tpot_ms']:.2f}), {row['tokens_per_s']:.0f} tok/s, {row['mean_tokens']:.1f} "
                f"tokens ({100 * row['at_max_tokens']:.0f}% at max), {row['copies_per_step']:.1f} copies and "
                f"{row['syncs_per_step']:.1f} syncs a step",
                flush=True,
            )
        print(
            f"all constrained / none: {part['all_vs_none_tpot']:.3f}; others beside one constrained / none: "
            f"{part['one_others_vs_none_tpot']:.3f}",
            flush=True,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-4b")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=5, help="runs of each batch (medians)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    if args.concurrency < 2 or args.max_tokens < 2:
        p.error("--concurrency needs 2 requests (one constrained among others), --max-tokens 2 tokens (a TPOT)")
    # No prefix cache: the batches repeat the same prompts, and a hit would spare one batch's prefill but not another's.
    args.overrides = {
        "engine.max_num_seqs": args.concurrency,
        "engine.max_model_len": args.prompt_len + args.max_tokens,
        "engine.prefix_caching": False,
        **dict(parse_override(s) for s in args.set),
    }
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rt = Runtime.from_yaml(args.config, overrides=args.overrides)
    result = {
        "config": args.config,
        "overrides": args.overrides,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "schema": PERSON,
        **environment(),
    }
    if "compile" in args.parts:  # first: the schema must be new to the engine
        result["compile"] = compile_times(rt, _prompts(rt, 1, args.prompt_len, 1 << 20)[0])
    if "batches" in args.parts:
        warm = _prompts(rt, args.concurrency, args.prompt_len, 1 << 21)
        for batch in BATCHES:  # Triton's compilations and the masked steps' graphs, captured at first need
            rt.generate(warm, _params(batch, args.concurrency, 4, 0))
        result["batches"] = batches(rt, args)
    show(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "constrained.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    main()
