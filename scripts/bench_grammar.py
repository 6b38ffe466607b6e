"""What structured outputs cost: on the host, xgrammar's work per step for Qwen3's vocabulary (151,936 ids) —
compiling a constraint (first use and cached), filling one bitmask row (µs, at every position of a valid output)
and filling a batch of rows in xgrammar's threads; on a GPU, the mask kernel (ops/grammar_mask.py) replayed in a
CUDA graph.

Usage: python -m scripts.bench_grammar [--parts fill kernel] [--rows 32] [--threads 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

VOCAB = 151936
EOS = (151645, 151643)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    },
    "required": ["name", "age", "color"],
}
STORY = "the quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill, " * 3
CASES = {  # name: (kind, constraint source, a valid output)
    "json schema": ("json", PERSON, '{"name": "Ada Lovelace", "age": 36, "color": "blue", "tags": ["math", "poet"]}'),
    "json schema, long string": (
        "json",
        {"type": "object", "properties": {"story": {"type": "string", "maxLength": 400}}, "required": ["story"]},
        json.dumps({"story": STORY.strip()}),
    ),
    "json_object": ("json_object", None, '{"a": [1, -2.5, true, null], "b": {"c": "some text here"}, "d": "e"}'),
    "regex, a date": ("regex", r"\d{4}-\d{2}-\d{2}", "2024-05-17"),
    "regex, free text": ("regex", r"(Yes|No), because [a-z ,]+\.", "Yes, because the sky is blue, and clear."),
}


def fill_costs(rows: int, threads: int) -> dict:
    """Per case: compile ms (first, cached), one row's fill µs over the valid output's positions (mean, median,
    p90, max), and µs a row when `rows` requests at the same position fill together."""
    from qwen3_runtime.structured.compiler import ConstraintCompiler
    from qwen3_runtime.structured.matcher import ConstraintMatcher, HostBitmask
    from qwen3_runtime.structured.spec import OutputConstraint
    from qwen3_runtime.tokenizer import Tokenizer

    tok = Tokenizer.builtin_qwen3()
    start = time.perf_counter()
    compiler = ConstraintCompiler(tok, VOCAB, EOS, threads=threads)
    results = {"tokenizer_info_ms": 1e3 * (time.perf_counter() - start), "rows": rows, "threads": threads}
    bitmask = HostBitmask.allocate(rows, VOCAB, pin=False, threads=threads)
    for name, (kind, source, text) in CASES.items():
        constraint = {
            "json": lambda: OutputConstraint.json_schema(source),
            "json_object": OutputConstraint.json_object,
            "regex": lambda: OutputConstraint.regex(source),
        }[kind]()
        start = time.perf_counter()
        grammar = compiler.compile(constraint)
        first = time.perf_counter() - start
        start = time.perf_counter()
        compiler.compile(constraint)
        cached = time.perf_counter() - start
        ids = tok.encode(text)
        one, batch = ConstraintMatcher(grammar), [ConstraintMatcher(grammar) for _ in range(rows)]
        single_us, batch_us = [], []
        for token in ids:
            start = time.perf_counter()
            one.fill(bitmask.array, 0)
            single_us.append(1e6 * (time.perf_counter() - start))
            start = time.perf_counter()
            bitmask.fill(range(rows), batch)
            batch_us.append(1e6 * (time.perf_counter() - start) / rows)
            assert one.accept(token) and all(m.accept(token) for m in batch), (name, token)
        results[name] = {
            "compile_ms": 1e3 * first,
            "cached_ms": 1e3 * cached,
            "tokens": len(ids),
            "fill_us_mean": statistics.fmean(single_us),
            "fill_us_median": statistics.median(single_us),
            "fill_us_p90": float(np.percentile(single_us, 90)),
            "fill_us_max": max(single_us),
            "batch_fill_us_per_row_mean": statistics.fmean(batch_us),
        }
    compiler.close()
    return results


def kernel_costs(row_counts: list[int]) -> dict:
    """µs of one mask pass over fp32 logits [rows, V] in a CUDA graph, every row masked by a random bitmask (about
    half the tokens banned), and with none of them masked (the programs exit at once)."""
    from qwen3_runtime.ops.grammar_mask import apply_grammar_mask
    from scripts.timing import graph_us_per_call

    results = {}
    for rows in row_counts:
        logits = torch.randn(rows, VOCAB, device="cuda")
        words = torch.randint(-(2**31), 2**31, (rows, VOCAB // 32), dtype=torch.int64)
        bitmask = words.to(torch.int32).cuda()
        every = torch.arange(rows, dtype=torch.int32, device="cuda")
        none = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
        results[rows] = {
            label: graph_us_per_call(lambda mask_row: apply_grammar_mask(logits, bitmask, mask_row), [mask_row] * 8)
            for label, mask_row in (("all rows masked", every), ("no row masked", none))
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["fill", "kernel"], choices=["fill", "kernel"])
    parser.add_argument("--rows", type=int, default=32, help="constrained rows filled together")
    parser.add_argument("--threads", type=int, default=8, help="xgrammar's threads (compiling, batch fills)")
    parser.add_argument("--out", type=Path, help="write grammar.json there")
    args = parser.parse_args()
    report: dict = {}
    if "fill" in args.parts:
        report["fill"] = fill_costs(args.rows, args.threads)
        print(f"TokenizerInfo: {report['fill']['tokenizer_info_ms']:.0f} ms")
        print(f"{'case':26s} {'compile ms':>10s} {'cached ms':>9s} {'mean µs':>8s} {'median':>7s} {'p90':>7s}", end="")
        print(f" {'max':>7s}  batch of {args.rows}, µs/row ({args.threads} threads)")
        for name in CASES:
            r = report["fill"][name]
            print(
                f"{name:26s} {r['compile_ms']:10.1f} {r['cached_ms']:9.3f} {r['fill_us_mean']:8.1f} "
                f"{r['fill_us_median']:7.1f} {r['fill_us_p90']:7.1f} {r['fill_us_max']:7.1f}  "
                f"{r['batch_fill_us_per_row_mean']:.1f}"
            )
    if "kernel" in args.parts and torch.cuda.is_available():
        report["kernel"] = kernel_costs([1, 8, 32, 64, 128])
        for rows, r in report["kernel"].items():
            print(f"mask kernel, {rows:3d} rows: " + ", ".join(f"{k} {v:.1f} µs" for k, v in r.items()))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "grammar.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
