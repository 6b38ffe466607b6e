"""Collect the JSON results of scripts/gpu_check.sh into docs/benchmarks.json and docs/BENCHMARKS.md.

Usage: python -m scripts.write_report RESULT_DIR [RESULT_DIR ...] [--notes docs/notes.md]
Later directories win for the keys of a result they share; each table names the run it comes from.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _provenance(result: dict) -> str:
    commit = result.get("commit") or result.get("git_commit") or "unknown"
    return f"commit `{commit}`, {result.get('gpu')}, torch {result.get('torch')}, triton {result.get('triton')}, {result.get('date')}"


def _decode(r: dict) -> list[str]:
    lines = [f"## Decode TPOT, {r['config']} (random bf16 weights), greedy, {r['prompt_len']}-token prompts, "
             f"{r['max_tokens']} output tokens, median of {r['repeats']}", "", _provenance(r), "",
             "| mode | batch | TPOT ms | TTFT ms | output tokens/s |", "|---|---|---|---|---|"]
    lines += [f"| {row.get('mode', 'eager')} | {row['batch']} | {row['tpot_ms']:.2f} | {row['ttft_ms']:.1f} | "
              f"{row['tokens_per_s']:.0f} |" for row in r["rows"]]
    return lines


def _reduce(r: dict) -> list[str]:
    lines = ["## Logprobs reduction, V = 151936 (CUDA-graph replay medians, µs per call)", "", _provenance(r),
             f"; device-to-device copy {r['copy_bandwidth_bytes_s'] / 1e12:.2f} TB/s measured in the same run", "",
             "| logits | N | k | reduce µs | floor µs | achieved TB/s | eager PyTorch µs | speed-up | host path µs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in r["results"]:
        host = f"{row['host_us']:.0f}" if row.get("host_us") else "–"
        lines.append(f"| {row['dtype']} | {row['n_rows']} | {row['k']} | {row['reduce_us']:.1f} | {row['floor_us']:.2f} | "
                     f"{row['achieved_tb_s']:.2f} | {row['eager_us']:.1f} | {row['speedup_vs_eager']:.1f}× | {host} |")
    return lines


def _lm_head(r: dict) -> list[str]:
    lines = ["## fp32 logits: the lm_head written in fp32 vs bf16 (Qwen3-4B shape, µs per step)", "", _provenance(r), "",
             "| batch | fp32 out | bf16 out | bf16 out + .float() | max rel err fp32 out | max rel err bf16 out |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {row['batch']} | {row['fp32_out_us']:.1f} | {row['bf16_out_us']:.1f} | {row['bf16_then_float_us']:.1f} | "
              f"{row['fp32_out_rel_err']:.1e} | {row['bf16_out_rel_err']:.1e} |" for row in r["rows"]]
    return lines


def _parity(r: dict) -> list[str]:
    return [f"## bf16 parity with transformers on the GPU ({r['config']} shape, random weights, "
            f"{r['prompt_len']}-token prompt)", "", _provenance(r), "",
            "| max abs err | max rel err (of max abs logit) | decode step max rel err | mean abs err | argmax agreement |",
            "|---|---|---|---|---|",
            f"| {r['max_abs_err']:.3g} | {r['max_rel_err']:.2e} | {r['decode_max_rel_err']:.2e} | "
            f"{r['mean_abs_err']:.2e} | {100 * r['argmax_agreement']:.1f}% |"]


def _logprobs(r: dict) -> list[str]:
    lines = []
    if "matrix" in r:
        lines += _logprobs_matrix(r)
    if "copies" in r:
        lines += ["", "Per decode step, counted by torch.profiler", "",
                  "| path | logprobs | concurrency | device-to-host copies | bytes | host syncs |", "|---|---|---|---|---|---|"]
        lines += [f"| {x['path']} | {x['logprobs']} | {x['concurrency']} | {x['d2h_copies_per_step']:.1f} | "
                  f"{x['d2h_bytes_per_step']:.0f} | {x['host_syncs_per_step']:.1f} |" for x in r["copies"]]
    return lines


def _logprobs_matrix(r: dict) -> list[str]:
    lines = [f"## Logprobs end to end, {r['config']} (random bf16 weights), greedy, {r['prompt_len']}-token prompts, "
             f"{r['max_tokens']} output tokens, median of {r['repeats']}", "", _provenance(r), "",
             "| concurrency | logprobs | path | TPOT ms | TPOT / logprobs off | output tokens/s |", "|---|---|---|---|---|---|"]
    lines += [f"| {x['concurrency']} | {x['logprobs'] if x['logprobs'] is not None else 'off'} | {x['path']} | "
              f"{x['tpot_ms']:.2f} | {x['tpot_vs_off']:.3f} | {x['tokens_per_s']:.0f} |" for x in r["matrix"]]
    lines += ["", "Concurrency 8 with one logprobs=5 request: what the seven other rows pay", "",
              "| path | batch | other rows' TPOT ms | output tokens/s |", "|---|---|---|---|"]
    lines += [f"| {x['path']} | {x['batch']} | {x['others_tpot_ms']:.2f} | {x['tokens_per_s']:.0f} |" for x in r["mixed"]]
    lines += ["", "Prompt logprobs on a 1024-token prompt", "", "| path | prompt_logprobs | prefill ms |", "|---|---|---|"]
    lines += [f"| {x['path']} | {x['prompt_logprobs']} | {x['prefill_ms']:.1f} |" for x in r["prompt"]]
    return lines


SECTIONS = {"decode.json": _decode, "reduce.json": _reduce, "lm_head.json": _lm_head, "parity.json": _parity,
            "logprobs.json": _logprobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--notes", type=Path, help="markdown appended after the tables (analysis)")
    args = parser.parse_args()
    results = {}
    for d in args.dirs:
        for name in SECTIONS:
            for path in (d / name, d / "bench" / name):
                if path.is_file():  # a later run's keys replace an earlier run's
                    results[name] = {**results.get(name, {}), **json.loads(path.read_text())}
    lines = ["# Benchmarks", "", "Measured on the H200 through the device tool by `scripts/gpu_check.sh`; "
             "every ratio is taken inside one run. Raw figures: `docs/benchmarks.json`.", ""]
    for name, section in SECTIONS.items():
        if name in results:
            lines += section(results[name]) + [""]
    if args.notes:
        lines += [args.notes.read_text()]
    DOCS.mkdir(exist_ok=True)
    (DOCS / "BENCHMARKS.md").write_text("\n".join(lines))
    (DOCS / "benchmarks.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
