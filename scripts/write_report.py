"""Collect the JSON results of scripts/gpu_check.sh into docs/benchmarks.json, docs/BENCHMARKS.md (the main
runs, then the analysis), docs/benchmark-runs.md (the other runs' tables) and the PNG plots.

Usage: python -m scripts.write_report RESULT_DIR [RESULT_DIR ...] [--notes docs/benchmark-notes.md]
Later directories win for the parts of a result they share; every table names the run (commit, date,
repetitions) its part comes from. `logprobs-NAME.json` and `decode-NAME.json` files (other runs: device-path
re-runs of the matrix, an earlier commit's full run, decode with async scheduling) are reported in
benchmark-runs.md, and counted beside logprobs.json and decode.json in the targets table. With --since COMMIT
the targets table also gives, per target, how many runs of the code as it stands (those at COMMIT or after it, the
last change to the runtime or the benchmarks) met the bar, and their median.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN_KEYS = ("commit", "gpu", "torch", "triton", "date", "repeats", "max_tokens", "prompt_len", "config")
# Files whose parts may come from different runs (bench_logprobs --parts, bench_kernels --parts), by name prefix.
PARTED = {"logprobs": ("matrix", "mixed", "prompt", "copies"), "kernels": ("gemm", "attention")}


def _kind_and_run(name: str) -> tuple[str, str]:
    """ "logprobs-device-rerun-1.json" -> ("logprobs", "device-rerun-1"); "decode.json" -> ("decode", "")."""
    kind, _, run = name.removesuffix(".json").partition("-")
    return kind, run


def _parts(name: str) -> tuple[str, ...]:
    return PARTED.get(_kind_and_run(name)[0], ())


def load(dirs: list[Path]) -> dict:
    """{file: {...}}; parted files keep {part: {"run": run keys, "rows": rows}}."""
    results: dict = {}
    for d in dirs:
        for path in sorted(d.glob("*.json")):
            data = json.loads(path.read_text())
            run = {k: data[k] for k in RUN_KEYS if k in data}
            if _parts(path.name):
                entry = results.setdefault(path.name, {})
                entry.update({part: {"run": run, "rows": data[part]} for part in _parts(path.name) if part in data})
            else:
                results[path.name] = data
    return results


def _run(r: dict) -> str:
    extra = f", median of {r['repeats']}" if "repeats" in r else ""
    return (
        f"commit `{r.get('commit', 'unknown')}`, {r.get('gpu')}, torch {r.get('torch')}, triton {r.get('triton')}, "
        f"{r.get('date')}{extra}"
    )


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(map(str, r)) + " |" for r in rows
    ]


def _ours(decode: dict, batch: int, mode: str = "graph") -> dict | None:
    return next((r for r in decode["rows"] if r["mode"] == mode and r["batch"] == batch), None)


# Our decode modes whose speed-up over transformers a decode run may carry: (mode, row key, label).
SPEEDUPS = (("graph-async", "speedup_of_async", ", async scheduling"), ("graph", "speedup_of_ours", ", synchronous"))


# How many of the other runs' figures a target's row lists, the latest first (benchmark-runs.md holds them all).
LISTED_RUNS = 6


def targets(results: dict, since: str | None = None) -> list[str]:
    """Issue 5's targets, a row each: the main run's figure (logprobs.json, decode.json), then how many of the
    other runs (earlier commits, re-runs) met the bar and the latest of their figures; with `since`, first how
    many runs at that commit or after it met the bar, and their median (the runs differ by more from machine to
    machine than inside one run)."""
    found: dict[tuple[str, str, str], list[tuple[bool, str, float | str, bool]]] = {}  # (target, bar, format): runs

    def add(target: str, bar: str, fmt: str, main: bool, commit: str, value: float | str, ok: bool) -> None:
        found.setdefault((target, bar, fmt), []).append((main, commit, value, ok))

    for name in _files(results, "logprobs"):
        lp, main = results[name], name == "logprobs.json"
        commit = {part: entry["run"].get("commit", "unknown") for part, entry in lp.items()}
        if "matrix" in lp:
            m = lp["matrix"]["rows"]
            for c in (1, 8, 32):
                ratio = next(
                    r["tpot_vs_off"]
                    for r in m
                    if r["concurrency"] == c and r["logprobs"] == 5 and r["path"] == "device"
                )
                add(
                    f"logprobs=5 TPOT / off, concurrency {c}",
                    "≤ 1.02",
                    "{:.3f}",
                    main,
                    commit["matrix"],
                    ratio,
                    ratio <= 1.02,
                )
        if "mixed" in lp:
            mixed = {r["batch"]: r["others_tpot_ms"] for r in lp["mixed"]["rows"] if r["path"] == "device"}
            ratio = mixed["one logprobs=5"] / mixed["all off"]
            add(
                "mixed batch of 8: other rows' TPOT / all off",
                "1 ± 0.01",
                "{:.3f}",
                main,
                commit["mixed"],
                ratio,
                abs(ratio - 1) <= 0.01,
            )
        if "prompt" in lp:
            p = {r["prompt_logprobs"]: r["prefill_ms"] for r in lp["prompt"]["rows"] if r["path"] == "device"}
            extra = p[5] / p[None] - 1
            add(
                "prompt logprobs (5) on 1024 tokens: extra prefill time",
                "≤ 5%",
                "{:.1%}",
                main,
                commit["prompt"],
                extra,
                extra <= 0.05,
            )
        if "copies" in lp:
            dev = [r for r in lp["copies"]["rows"] if r["path"] == "device"]
            ok = all(r["d2h_copies_per_step"] == 1 and r["host_syncs_per_step"] == 1 for r in dev)
            add(
                "device-to-host copies / syncs per decode step",
                "1 / 1",
                "{}",
                main,
                commit["copies"],
                " ; ".join(f"{r['d2h_copies_per_step']:g} / {r['host_syncs_per_step']:g}" for r in dev),
                ok,
            )
    for name in _files(results, "decode"):
        d, main = results[name], name == "decode.json"
        for mode, key, label in SPEEDUPS:
            if _ours(d, 1, mode):
                ratio = _ours(d, 1, mode)["tpot_ms"] / d["floor_ms"]
                add(
                    f"decode TPOT / weight-read floor, batch 1{label}",
                    "≤ 1.25",
                    "{:.3f}",
                    main,
                    d["commit"],
                    ratio,
                    ratio <= 1.25,
                )
            for r in d["rows"]:
                if key in r:
                    add(
                        f"speed-up over transformers static cache, batch {r['batch']}{label}",
                        "≥ 2.5×",
                        "{:.2f}×",
                        main,
                        d["commit"],
                        r[key],
                        r[key] >= 2.5,
                    )
    rows = []
    for (target, bar, fmt), runs in found.items():
        main = next((f"{fmt.format(value)} {_mark(ok)}" for is_main, _, value, ok in runs if is_main), "–")
        others = [
            (commit, fmt.format(value) if ok else f"**{fmt.format(value)}**", ok)
            for is_main, commit, value, ok in runs
            if not is_main
        ]
        met = f"{sum(ok for *_, ok in others)} of {len(others)}"
        latest = ", ".join(f"{figure} (`{commit}`)" for commit, figure, _ in others[:LISTED_RUNS])
        current = [(value, ok) for _, commit, value, ok in runs if since and _descends(commit, since)]
        rows.append(
            [
                target,
                bar,
                main,
                *([_met_and_median(current, fmt)] if since else []),
                f"{met}; latest: {latest}" if others else "–",
            ]
        )
    header = ["target", "bar", "main run", *([f"runs since `{since}` met"] if since else []), "other runs met"]
    return [
        "## Issue 5's targets",
        "",
        "The main run's figure, then "
        + (
            f"how many runs of the code as it stands (at `{since}` or after it, main run included) met the bar, "
            "and their median; then "
            if since
            else ""
        )
        + "the other runs' (earlier commits and re-runs; each has its table in [benchmark-runs.md]"
        "(benchmark-runs.md)): how many met the bar, and the latest figures, misses in bold.",
        "",
    ] + _table(header, rows)


def _met_and_median(runs: list[tuple[float | str, bool]], fmt: str) -> str:
    if not runs:
        return "–"
    met, values = f"{sum(ok for _, ok in runs)} of {len(runs)}", [value for value, _ in runs]
    return met if isinstance(values[0], str) else f"{met}, median {fmt.format(statistics.median(values))}"


@functools.cache
def _descends(commit: str, base: str) -> bool:
    """Whether `commit` is `base` or has it in its history (a commit git does not know counts as older)."""
    return (
        subprocess.run(["git", "merge-base", "--is-ancestor", base, commit], cwd=ROOT, capture_output=True).returncode
        == 0
    )


def _files(results: dict, kind: str) -> list[str]:
    """KIND.json first, then the other runs (KIND-NAME.json), the latest first."""
    names = [name for name in results if _kind_and_run(name)[0] == kind]
    by_date = sorted(names, key=lambda name: _date(results[name]), reverse=True)
    return sorted(by_date, key=lambda name: name != f"{kind}.json")


def _date(result: dict) -> str:
    """A run's date ("YYYY-MM-DD HH:MM UTC", so ordered as text); the latest part's for a parted file."""
    dates = [result.get("date", "")] + [
        part["run"].get("date", "") for part in result.values() if isinstance(part, dict) and "run" in part
    ]
    return max(dates)


def _mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def decode(d: dict, other_run: str = "") -> list[str]:
    lines = [
        f"## Decode TPOT{other_run}, {d['config']} (random bf16 weights), greedy, {d['prompt_len']}-token prompts, "
        f"{d['max_tokens']} output tokens",
        "",
        _run(d),
        "",
        f"Weight-read floor: {d['weight_bytes'] / 1e9:.2f} GB of weights / {d['copy_bandwidth_bytes_s'] / 1e12:.2f} "
        f"TB/s device-to-device copy bandwidth (same run) = **{d['floor_ms']:.3f} ms**."
        + ("" if other_run else " ![TPOT against the floor](decode_vs_floor.png)"),
        "",
    ]
    if "note" in d:  # how the figures were obtained, where not the usual way
        lines += [f"Note: {d['note']}", ""]
    if any("itl_ms" in r for r in d["rows"]):
        lines += [
            "TPOT: a request's (last token − first token) / (tokens − 1), the median over the batch; ITL: the "
            "median gap between consecutive tokens reaching the host; both engines timed alike.",
            "",
        ]
    elif any(r["mode"].startswith("transformers") for r in d["rows"]):
        lines += [
            "In this run transformers' TPOT is its median gap between tokens and ours a request's (last token − "
            "first token) / (tokens − 1); later runs (with an ITL column) time both engines alike.",
            "",
        ]
    modes = [(key, f"ours ({mode}) is faster by") for mode, key, _ in SPEEDUPS if any(key in r for r in d["rows"])]
    spread = any("tpot_ms_runs" in r for r in d["rows"])
    rows = [
        [
            r["mode"],
            r["batch"],
            f"{r['tpot_ms']:.2f}",
            *([" / ".join(f"{t:.2f}" for t in r.get("tpot_ms_runs", []))] if spread else []),
            f"{r['itl_ms']:.2f}" if "itl_ms" in r else "–",
            f"{r['vs_floor']:.2f}",
            f"{r['ttft_ms']:.1f}" if "ttft_ms" in r else "–",
            f"{r['tokens_per_s']:.0f}" if "tokens_per_s" in r else "–",
            *(f"{r[key]:.2f}×" if key in r else "–" for key, _ in modes),
        ]
        for r in d["rows"]
    ]
    return lines + _table(
        [
            "mode",
            "batch",
            "TPOT ms",
            *(["TPOT ms, each run"] if spread else []),
            "ITL ms",
            "× floor",
            "TTFT ms",
            "output tokens/s",
            *(header for _, header in modes),
        ],
        rows,
    )


def profile(p: dict) -> list[str]:
    lines = [
        f"## Where a decode step's time goes ({p['config']}, torch.profiler over CUDA-graph replays)",
        "",
        _run(p),
        "",
        "wall: the engine's time per step, its host work overlapped with the GPU's (async "
        "scheduling); replay: one graph replay alone, its launch included (CUDA events); kernels: the sum of "
        "kernel times. A kernel launched early (programmatic dependent launch) is timed from its launch, its "
        "wait for the kernel before included, so kernels overlap and their sum exceeds the replay.",
        "",
    ]
    lines += _table(
        ["batch", "wall ms", "replay ms", "kernels ms", "launches"],
        [
            [
                r["batch"],
                f"{r['wall_ms']:.3f}",
                f"{r['replay_ms']:.3f}",
                f"{r['kernel_ms']:.3f}",
                f"{r['launches']:.0f}",
            ]
            for r in p["rows"]
        ],
    )
    for r in p["rows"]:
        if r["batch"] in (1, 32):
            lines += ["", f"Kernels per step at batch {r['batch']}:", ""]
            lines += _table(
                ["kernel", "launches", "µs per step"],
                [[k["kernel"], f"{k['launches']:.0f}", f"{k['us']:.1f}"] for k in r["kernels"][:8]],
            )
    return lines


def timeline(t: dict) -> list[str]:
    """The critical path of a middle layer (scripts/step_timeline.py), one column per batch size."""
    rows = t["rows"]
    lines = [
        f"## A decode step's critical path per layer ({t['config']}, scripts/step_timeline.py)",
        "",
        _run(t),
        "",
        "µs by which each kernel's end passes the previous kernel's end, the mean over the middle layers "
        f"(context {rows[0]['context']} tokens); the column sums are a layer's time.",
        "",
    ]
    kernels = [" / ".join(sorted({r["layer"][i][1] for r in rows})) for i in range(len(rows[0]["layer"]))]
    table = [
        [f"{role} ({kernels[i]})", *(f"{r['layer'][i][2]:.2f}" for r in rows)]
        for i, (role, *_) in enumerate(rows[0]["layer"])
    ]
    table.append(["layer", *(f"{sum(us for *_, us in r['layer']):.2f}" for r in rows)])
    table.append(["whole step (µs)", *(f"{r['step_us']:.0f}" for r in rows)])
    return lines + _table(["kernel", *(f"batch {r['batch']}" for r in rows)], table)


def kernels(k: dict) -> list[str]:
    lines = ["## Kernel decisions (scripts/bench_kernels.py, CUDA-graph replay medians, µs)"]
    if "gemm" in k:
        lines += [
            "",
            "Qwen3-4B projections, weights cycled past L2: cuBLAS against ops/linear.py (`linear` for "
            "qkv / gate_up, split-K `linear_partials` for o / down).",
            "",
            _run(k["gemm"]["run"]),
            "",
        ]
        lines += _table(
            ["projection", "rows", "floor µs", "cuBLAS µs", "ours µs", "ours % of floor"],
            [
                [
                    r["shape"],
                    r["m"],
                    f"{r['floor_us']:.1f}",
                    f"{r['cublas_us']:.1f}",
                    f"{r['ours_us']:.1f}",
                    f"{100 * r['floor_us'] / r['ours_us']:.0f}%",
                ]
                for r in k["gemm"]["rows"]
            ],
        )
    if "attention" in k:
        lines += [
            "",
            "Paged decode attention (32 q / 8 kv heads, head_dim 128, pages of 16), two programs per SM:",
            "",
            _run(k["attention"]["run"]),
            "",
        ]
        att = [r for r in k["attention"]["rows"] if r["programs_per_sm"] == 2]
        cases = sorted({(r["batch"], r["seq_len"]) for r in att})
        by = {(r["batch"], r["seq_len"], r["block_n"]): r for r in att}
        lines += _table(
            ["batch", "tokens/row", "floor µs", "tile 16", "tile 32", "tile 64"],
            [
                [b, n, f"{by[(b, n, 32)]['floor_us']:.1f}"] + [f"{by[(b, n, t)]['us']:.1f}" for t in (16, 32, 64)]
                for b, n in cases
            ],
        )
    return lines


def logprobs(lp: dict, rerun: str = "") -> list[str]:
    lines = []
    if "matrix" in lp:
        run = lp["matrix"]["run"]
        lines += [
            f"## Logprobs end to end{rerun}, {run['config']} (random bf16 weights), greedy, {run['prompt_len']}-token "
            f"prompts, {run['max_tokens']} output tokens",
            "",
            _run(run),
            "",
        ]
        lines += [] if rerun else ["![TPOT against concurrency](tpot_vs_concurrency.png)", ""]
        lines += _table(
            ["concurrency", "logprobs", "path", "TPOT ms", "TPOT / logprobs off", "output tokens/s"],
            [
                [
                    r["concurrency"],
                    "off" if r["logprobs"] is None else r["logprobs"],
                    r["path"],
                    f"{r['tpot_ms']:.2f}",
                    f"{r['tpot_vs_off']:.3f}",
                    f"{r['tokens_per_s']:.0f}",
                ]
                for r in lp["matrix"]["rows"]
            ],
        )
    if "mixed" in lp:
        lines += [
            "",
            "Concurrency 8 with exactly one logprobs=5 request: what the seven other rows pay (the two "
            "batches alternate run by run)",
            "",
            _run(lp["mixed"]["run"]),
            "",
        ]
        lines += _table(
            ["path", "batch", "other rows' TPOT ms", "output tokens/s"],
            [
                [r["path"], r["batch"], f"{r['others_tpot_ms']:.2f}", f"{r['tokens_per_s']:.0f}"]
                for r in lp["mixed"]["rows"]
            ],
        )
    if "prompt" in lp:
        calls = {r["calls"] for r in lp["prompt"]["rows"] if "calls" in r}  # older runs: `repeats` calls
        run = {**lp["prompt"]["run"], "repeats": max(calls)} if calls else lp["prompt"]["run"]
        lines += ["", "Prompt logprobs on a 1024-token prompt (with and without alternate)", "", _run(run), ""]
        lines += _table(
            ["path", "prompt_logprobs", "prefill ms"],
            [[r["path"], r["prompt_logprobs"], f"{r['prefill_ms']:.1f}"] for r in lp["prompt"]["rows"]],
        )
    if "copies" in lp:
        lines += [
            "",
            "Per decode step, counted by torch.profiler (not by the runtime's own counters)",
            "",
            _run({k: v for k, v in lp["copies"]["run"].items() if k != "repeats"}),
            "",
        ]
        lines += _table(
            ["path", "logprobs", "concurrency", "device-to-host copies", "bytes", "host syncs"],
            [
                [
                    r["path"],
                    r["logprobs"],
                    r["concurrency"],
                    f"{r['d2h_copies_per_step']:.1f}",
                    f"{r['d2h_bytes_per_step']:.0f}",
                    f"{r['host_syncs_per_step']:.1f}",
                ]
                for r in lp["copies"]["rows"]
            ],
        )
    return lines


def reduce(r: dict) -> list[str]:
    lines = [
        "## Logprobs reduction, V = 151936 (CUDA-graph replay medians, µs per call)",
        "",
        f"{_run(r)}; device-to-device copy {r['copy_bandwidth_bytes_s'] / 1e12:.2f} TB/s measured in the same run",
        "",
    ]
    return lines + _table(
        ["logits", "N", "k", "reduce µs", "floor µs", "achieved TB/s", "eager PyTorch µs", "speed-up", "host path µs"],
        [
            [
                x["dtype"],
                x["n_rows"],
                x["k"],
                f"{x['reduce_us']:.1f}",
                f"{x['floor_us']:.2f}",
                f"{x['achieved_tb_s']:.2f}",
                f"{x['eager_us']:.1f}",
                f"{x['speedup_vs_eager']:.1f}×",
                f"{x['host_us']:.0f}" if x.get("host_us") else "–",
            ]
            for x in r["results"]
        ],
    )


def lm_head(r: dict) -> list[str]:
    lines = ["## fp32 logits: the lm_head written in fp32 vs bf16 (Qwen3-4B shape, µs per step)", "", _run(r), ""]
    return lines + _table(
        ["batch", "fp32 out", "bf16 out", "bf16 out + .float()", "max rel err fp32 out", "max rel err bf16 out"],
        [
            [
                x["batch"],
                f"{x['fp32_out_us']:.1f}",
                f"{x['bf16_out_us']:.1f}",
                f"{x['bf16_then_float_us']:.1f}",
                f"{x['fp32_out_rel_err']:.1e}",
                f"{x['bf16_out_rel_err']:.1e}",
            ]
            for x in r["rows"]
        ],
    )


def parity(r: dict) -> list[str]:
    lines = [
        f"## bf16 parity with transformers on the GPU ({r['config']} shape, random weights, "
        f"{r['prompt_len']}-token prompt)",
        "",
        _run(r),
        "",
    ]
    return lines + _table(
        [
            "max abs err",
            "max rel err (of max abs logit)",
            "decode step max rel err",
            "mean abs err",
            "argmax agreement",
        ],
        [
            [
                f"{r['max_abs_err']:.3g}",
                f"{r['max_rel_err']:.2e}",
                f"{r['decode_max_rel_err']:.2e}",
                f"{r['mean_abs_err']:.2e}",
                f"{100 * r['argmax_agreement']:.1f}%",
            ]
        ],
    )


SECTIONS = {
    "decode.json": decode,
    "profile.json": profile,
    "timeline.json": timeline,
    "kernels.json": kernels,
    "logprobs.json": logprobs,
    "reduce.json": reduce,
    "lm_head.json": lm_head,
    "parity.json": parity,
}


def plots(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "matrix" in results.get("logprobs.json", {}):
        rows = results["logprobs.json"]["matrix"]["rows"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (k, path), style in zip(
            [(None, "-"), (1, "device"), (5, "device"), (1, "host"), (5, "host")], ["k-o", "b-s", "b--^", "r-s", "r--^"]
        ):
            pts = sorted((r["concurrency"], r["tpot_ms"]) for r in rows if r["logprobs"] == k and r["path"] == path)
            ax.plot(*zip(*pts), style, label="logprobs off" if k is None else f"logprobs={k}, {path} path")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="concurrency",
            ylabel="TPOT (ms)",
            title="Qwen3-4B decode TPOT by logprobs setting and path (H200)",
        )
        ax.set_xticks([1, 8, 32], ["1", "8", "32"])
        ax.legend()
        fig.tight_layout()
        fig.savefig(DOCS / "tpot_vs_concurrency.png", dpi=120)
    if "decode.json" in results:
        d = results["decode.json"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        labels = {
            "graph-async": "qwen3_runtime (CUDA graphs, async scheduling)",
            "graph": "qwen3_runtime (CUDA graphs, synchronous)",
            "transformers static cache": "transformers static cache",
        }
        for (mode, label), style in zip(labels.items(), ("b-o", "c--o", "r-s")):
            pts = sorted((r["batch"], r["tpot_ms"]) for r in d["rows"] if r["mode"] == mode)
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        ax.axhline(d["floor_ms"], color="k", linestyle="--", label=f"weight-read floor {d['floor_ms']:.2f} ms")
        ax.axhline(1.25 * d["floor_ms"], color="gray", linestyle=":", label="1.25 × floor")
        ax.set(
            xscale="log",
            xlabel="batch",
            ylabel="TPOT (ms)",
            ylim=(0, None),
            title="Qwen3-4B decode TPOT against the weight-read floor (H200)",
        )
        ax.set_xticks([1, 8, 32, 64], ["1", "8", "32", "64"])
        ax.legend()
        fig.tight_layout()
        fig.savefig(DOCS / "decode_vs_floor.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--notes", type=Path, help="markdown appended after the tables (analysis)")
    parser.add_argument(
        "--since",
        help="the last commit that changed the runtime or the benchmarks: the targets "
        "table counts the runs since it apart",
    )
    args = parser.parse_args()
    results = load(args.dirs)
    lines = [
        "# Benchmarks",
        "",
        "Measured on the H200 through the device tool by `scripts/gpu_check.sh`; every ratio "
        "is taken inside one run. Raw figures: `docs/benchmarks.json`; the other runs' tables (earlier commits, "
        "re-runs): [benchmark-runs.md](benchmark-runs.md). The analysis follows the tables.",
        "",
    ]
    lines += targets(results, args.since) + [""]
    for name, section in SECTIONS.items():
        if name in results:
            lines += section(results[name]) + [""]
    if args.notes:
        lines += [args.notes.read_text()]
    runs = [
        "# Benchmarks: the other runs",
        "",
        "Earlier commits' runs and re-runs, the latest first; the main runs "
        "and the analysis are in [BENCHMARKS.md](BENCHMARKS.md).",
        "",
    ]
    for name in [name for name in _files(results, "decode") if name != "decode.json"]:
        runs += decode(results[name], other_run=f": {_kind_and_run(name)[1]}") + [""]
    for name in [name for name in _files(results, "logprobs") if name != "logprobs.json"]:
        runs += logprobs(results[name], rerun=f": {_kind_and_run(name)[1]}") + [""]
    DOCS.mkdir(exist_ok=True)
    (DOCS / "BENCHMARKS.md").write_text("\n".join(lines))
    (DOCS / "benchmark-runs.md").write_text("\n".join(runs))
    (DOCS / "benchmarks.json").write_text(json.dumps(results, indent=1))
    plots(results)


if __name__ == "__main__":
    main()
