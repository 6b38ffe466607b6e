"""Render the latest benchmark run into docs/BENCHMARKS.md (the tables between its markers; the text around
them is written by hand and kept), docs/benchmarks.json and the three PNG plots.

Usage: python -m scripts.write_report [RESULT_DIR]

RESULT_DIR holds what scripts/gpu_check.sh wrote under $OUT: decode.json (bench_decode), logprobs.json
(bench_logprobs) and serving.json (bench_serving); each one found replaces the stored run of its kind in
docs/benchmarks.json. A logprobs run
without the host path keeps the last stored run that has it, so the tables can still set the two paths side
by side. Without RESULT_DIR the tables and plots are rendered again from docs/benchmarks.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
STORE = DOCS / "benchmarks.json"
BEGIN = "<!-- tables: rendered by scripts/write_report.py from docs/benchmarks.json; edit outside the markers -->"
END = "<!-- end of tables -->"
RUN_KEYS = ("commit", "gpu", "torch", "triton", "date", "repeats", "max_tokens", "prompt_len", "config")
PARTS = ("matrix", "mixed", "prompt", "copies")


def load_logprobs(path: Path) -> dict:
    """bench_logprobs' file as {part: {"run": where and when, "rows": rows}}."""
    data = json.loads(path.read_text())
    run = {k: data[k] for k in RUN_KEYS if k in data}
    return {part: {"run": run, "rows": data[part]} for part in PARTS if part in data}


def has_host(lp: dict) -> bool:
    return any(r["path"] == "host" for r in lp.get("matrix", {}).get("rows", []))


def update(stored: dict, result_dir: Path) -> dict:
    """The stored runs with RESULT_DIR's in their place (a run without the host path keeps one that has it)."""
    if (result_dir / "decode.json").exists():
        stored["decode"] = json.loads((result_dir / "decode.json").read_text())
    if (result_dir / "logprobs.json").exists():
        latest = load_logprobs(result_dir / "logprobs.json")
        with_host = [lp for lp in stored.get("logprobs", []) if has_host(lp)][:1]
        stored["logprobs"] = [latest] + ([] if has_host(latest) else with_host)
    if (result_dir / "serving.json").exists():
        stored["serving"] = with_host_rows(json.loads((result_dir / "serving.json").read_text()), stored.get("serving"))
    return stored


def with_host_rows(latest: dict, old: dict | None) -> dict:
    """A serving run without the host path keeps the host rows of the last run that had them, marked with its
    commit (their ratios stay within that run)."""
    if old is None or any(r["path"] == "host" for r in latest["rows"]):
        return latest
    carried = [{"carried_from": old["commit"], **r} for r in old["rows"] if r["path"] == "host"]
    return {**latest, "rows": latest["rows"] + carried}


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(map(str, r)) + " |" for r in rows
    ]


def _run(r: dict, repeats: bool = True) -> str:
    repeats = f", median of {r['repeats']} runs" if repeats and "repeats" in r else ""
    return f"`{r['commit']}`, {r['gpu']}, torch {r['torch']}, triton {r['triton']}, {r['date']}{repeats}"


def decode(d: dict) -> list[str]:
    """One row per batch: ours (CUDA graphs, async scheduling) against the floor and transformers."""
    ours = {r["batch"]: r for r in d["rows"] if r["mode"] == "graph-async"}
    hf = {r["batch"]: r for r in d["rows"] if r["mode"] == "transformers static cache"}

    def spread(r: dict) -> str:
        runs = r.get("tpot_ms_runs", [r["tpot_ms"]])
        return f"{r['tpot_ms']:.2f} ({min(runs):.2f}–{max(runs):.2f})"

    rows = [
        [
            b,
            spread(r),
            f"{r['vs_floor']:.3f}",
            spread(hf[b]) if b in hf else "–",
            f"{hf[b]['speedup_of_async']:.2f}×" if b in hf else "–",
            f"{r['ttft_ms']:.0f}",
            f"{r['tokens_per_s']:.0f}",
        ]
        for b, r in sorted(ours.items())
    ]
    header = ["batch", "ours TPOT ms (runs)", "× floor", "transformers TPOT ms (runs)", "speed-up", "TTFT ms", "tok/s"]
    return [
        f"### Decode: {d['config']}, random bf16 weights, greedy, {d['prompt_len']}-token prompts, "
        f"{d['max_tokens']} output tokens",
        "",
        _run(d),
        "",
        f"Weight-read floor: {d['weight_bytes'] / 1e9:.2f} GB of weights / {_bandwidth(d)} (same run) = "
        f"**{d['floor_ms']:.3f} ms**.",
        "",
        *_table(header, rows),
    ]


def _bandwidth(d: dict) -> str:
    """The bandwidth a run's byte floors were taken at (runs before the read bandwidth was measured: the copy's)."""
    copy = f"{d['copy_bandwidth_bytes_s'] / 1e12:.2f} TB/s device-to-device copy"
    if "read_bandwidth_bytes_s" not in d:
        return f"{copy} bandwidth"
    return f"{d['bandwidth_bytes_s'] / 1e12:.2f} TB/s (the larger of {copy} and {d['read_bandwidth_bytes_s'] / 1e12:.2f} read)"


def matrix(runs: list[dict]) -> list[str]:
    """TPOT with logprobs over TPOT without, one row per run and concurrency."""
    rows = []
    for lp in [lp for lp in runs if "matrix" in lp]:
        by = {(r["concurrency"], r["logprobs"], r["path"]): r for r in lp["matrix"]["rows"]}
        for c in sorted({c for c, *_ in by}):
            ratios = [by.get((c, k, path)) for path in ("device", "host") for k in (1, 5)]
            rows.append(
                [f"`{lp['matrix']['run']['commit']}`", c, f"{by[(c, None, '-')]['tpot_ms']:.2f}"]
                + [f"{r['tpot_vs_off']:.3f}" if r else "–" for r in ratios]
            )
    header = ["run", "concurrency", "TPOT off ms", "device, 1", "device, 5", "host, 1", "host, 5"]
    return ["**TPOT / logprobs off**, by path and number of logprobs asked", ""] + _table(header, rows)


def _by_path(runs: list[dict], part: str) -> list[tuple[str, str, list[dict]]]:
    """(run, path, rows) for each path of the latest run, then for the host path of the older run kept for it."""
    found = []
    for lp in runs:
        if part in lp:
            rows, commit = lp[part]["rows"], f"`{lp[part]['run']['commit']}`"
            for path in sorted({r["path"] for r in rows}):
                if lp is runs[0] or path == "host":
                    found.append((commit, path, [r for r in rows if r["path"] == path]))
    return found


def mixed(runs: list[dict]) -> list[str]:
    rows = []
    for commit, path, part_rows in _by_path(runs, "mixed"):
        by = {r["batch"]: r["others_tpot_ms"] for r in part_rows}
        off, one = by["all off"], by["one logprobs=5"]
        rows.append([commit, path, f"{off:.3f}", f"{one:.3f}", f"{one / off:.4f}"])
    header = ["run", "path", "all off", "one row logprobs=5", "ratio"]
    return ["**Mixed batch**: concurrency 8, one row asking logprobs=5; the seven others' TPOT ms", ""] + _table(
        header, rows
    )


def prompt(runs: list[dict]) -> list[str]:
    rows = []
    for commit, path, part_rows in _by_path(runs, "prompt"):
        by = {r["prompt_logprobs"]: r["prefill_ms"] for r in part_rows}
        off, five = by[None], by[5]
        extra = f"{five / off - 1:+.1%}" if five < 2 * off else f"{five / off:.0f}×"
        rows.append([commit, path, f"{off:.2f}", f"{five:.2f}", extra])
    header = ["run", "path", "prefill ms", "with prompt_logprobs=5", "extra"]
    return ["**Prompt logprobs** on one 1024-token prompt", ""] + _table(header, rows)


def copies(runs: list[dict]) -> list[str]:
    rows = [
        [
            commit,
            path,
            "off" if r["logprobs"] is None else r["logprobs"],
            f"{r['d2h_copies_per_step']:g}",
            f"{r['d2h_bytes_per_step']:.0f}",
            f"{r['host_syncs_per_step']:g}",
        ]
        for commit, path, part_rows in _by_path(runs, "copies")
        for r in part_rows
    ]
    header = ["run", "path", "logprobs", "D2H copies", "bytes", "host syncs"]
    return ["**Per decode step** at concurrency 8, counted by torch.profiler", ""] + _table(header, rows)


def logprobs(runs: list[dict]) -> list[str]:
    """The latest run's parts, each followed by the same part of the last run with the host path, if kept."""
    first = runs[0]["matrix"]["run"]
    dates = {part["run"]["commit"]: part["run"]["date"] for lp in runs for part in lp.values()}
    intro = (
        f"{first['config']}, random bf16 weights, greedy, {first['prompt_len']}-token prompts, {first['max_tokens']} "
        f"output tokens; {first['gpu']}, torch {first['torch']}, triton {first['triton']}; TPOT the median of "
        f"{first['repeats']} runs. Runs: " + "; ".join(f"`{commit}` ({date})" for commit, date in dates.items()) + "."
    )
    if len(runs) > 1:
        intro += (
            " The latest measured the device path only; the host path's rows come from the last run that measured"
            " it (the matrix shows that run's device path too)."
        )
    lines = ["### Logprobs", "", intro]
    for part, render in (("matrix", matrix), ("mixed", mixed), ("prompt", prompt), ("copies", copies)):
        if part in runs[0]:
            lines += [""] + render(runs)
    return lines


def serving(d: dict) -> list[str]:
    """The logprobs matrix as HTTP clients saw it, the mixed run, and the server against the offline API."""
    lines = [
        f"### Serving: {d['config']} through `qwen3-runtime serve`, greedy, {d['prompt_len']}-token prompts, "
        f"{d['max_tokens']} output tokens, closed-loop clients (`scripts/bench_serving.py`)",
        "",
        _run(d, repeats=False) + f", {d['waves']} requests per client, medians over requests",
        "",
    ]
    plain = [r for r in d["rows"] if not r.get("mixed")]
    off = {(r["path"], r["concurrency"]): r["metrics"]["all"] for r in plain if r["logprobs"] is None}
    rows = []
    for r in plain:
        m, base = r["metrics"]["all"], off[r["path"], r["concurrency"]]
        server = r.get("server") or {}  # the server's own view (absent from older runs)
        path = r["path"] + (f" (`{r['carried_from']}`)" if "carried_from" in r else "")
        rows.append([
            path, r["concurrency"], "off" if r["logprobs"] is None else r["logprobs"],
            f"{m['median_tpot_ms']:.2f}", f"{m['median_tpot_ms'] / base['median_tpot_ms']:.3f}",
            f"{m['median_itl_ms']:.2f}", f"{m['p99_itl_ms']:.1f}", f"{m['median_ttft_ms']:.0f}",
            *(f"{server[k]:.2f}" if server.get(k) else "–" for k in ("engine_ms_per_step", "api_mean_tpot_ms")),
        ])  # fmt: skip
    header = ["path", "concurrency", "logprobs", "TPOT ms", "÷ off", "ITL p50 ms", "ITL p99 ms", "TTFT p50 ms",
              "engine ms/step", "API mean TPOT ms"]  # fmt: skip
    lines += _table(header, rows)
    for r in (r for r in d["rows"] if r.get("mixed")):
        others = r["metrics"]["no_logprobs"]["median_tpot_ms"]
        base = off[r["path"], r["concurrency"]]["median_tpot_ms"]
        lines += ["", f"Mixed, concurrency {r['concurrency']} with one logprobs={r['logprobs']} client ({r['path']} "
                  f"path): the other clients' TPOT {others:.2f} ms, {others / base:.3f} × the all-off run."]  # fmt: skip
    this_run = {(r["path"], r["concurrency"]) for r in plain if r["logprobs"] is None and "carried_from" not in r}
    paths = [path for path in ("device", "host") if any(p == path for p, _ in this_run)]
    rows = []
    for c, tpot in d.get("offline_tpot_ms", {}).items():
        served = [off[path, int(c)] for path in paths if (path, int(c)) in this_run]
        rows.append([c, f"{tpot:.2f}", *(f"{s['median_tpot_ms']:.2f} ({s['median_tpot_ms'] / tpot:.3f})" for s in served),
                     *(f"{s['median_itl_ms']:.2f}" for s in served)])  # fmt: skip
    if rows:
        lines += ["", "Server against the offline API (`Runtime.generate`, all of a wave's requests at once, in the "
                  "same run), logprobs off:", ""]  # fmt: skip
        header = ["concurrency", "offline TPOT ms", *(f"server ({p} path) TPOT ms (÷ offline)" for p in paths),
                  *(f"ITL p50 ({p})" for p in paths)]  # fmt: skip
        lines += _table(header, rows)
    return lines


def tables(stored: dict) -> str:
    lines = [BEGIN, ""]
    if "decode" in stored:
        lines += decode(stored["decode"]) + ["", "![Decode TPOT against the floor](decode_vs_floor.png)", ""]
    if stored.get("logprobs"):
        lines += logprobs(stored["logprobs"]) + ["", "![TPOT against concurrency](tpot_vs_concurrency.png)", ""]
    if "serving" in stored:
        lines += serving(stored["serving"]) + ["", "![TPOT through the server](serving_tpot_vs_concurrency.png)", ""]
    return "\n".join(lines + [END])


def write_markdown(stored: dict) -> None:
    path = DOCS / "BENCHMARKS.md"
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} lacks the table markers:\n{BEGIN}\n{END}")
    head, rest = text.split(BEGIN, 1)
    path.write_text(head + tables(stored) + rest.split(END, 1)[1])


def plot_decode(plt, d: dict) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, label, style in (
        ("graph-async", "qwen3_runtime (CUDA graphs, async scheduling)", "b-o"),
        ("transformers static cache", "transformers static cache", "r-s"),
    ):
        pts = sorted((r["batch"], r["tpot_ms"]) for r in d["rows"] if r["mode"] == mode)
        if pts:
            ax.plot(*zip(*pts), style, label=label)
    ax.axhline(d["floor_ms"], color="k", linestyle="--", label=f"weight-read floor {d['floor_ms']:.2f} ms")
    ax.axhline(1.25 * d["floor_ms"], color="gray", linestyle=":", label="1.25 × floor")
    batches = sorted({r["batch"] for r in d["rows"]})
    ax.set(xscale="log", xlabel="batch", ylabel="TPOT (ms)", ylim=(0, None))
    ax.set_title(f"{d['config']} decode TPOT against the weight-read floor ({d['gpu']}, {d['commit']})")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.legend()
    fig.tight_layout()
    fig.savefig(DOCS / "decode_vs_floor.png", dpi=120)


def plot_logprobs(plt, runs: list[dict]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for lp, dashes in zip(runs, ("-", "--")):
        rows, commit = lp["matrix"]["rows"], lp["matrix"]["run"]["commit"]
        for k, path, style, label in (
            (None, "-", "kx", "off"),
            (5, "device", "bo", "5, device"),
            (5, "host", "rs", "5, host"),
        ):
            pts = sorted((r["concurrency"], r["tpot_ms"]) for r in rows if r["logprobs"] == k and r["path"] == path)
            if pts:
                ax.plot(*zip(*pts), style + dashes, label=f"logprobs {label} ({commit})", zorder=3 if k is None else 2)
    run = runs[0]["matrix"]["run"]
    ax.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="TPOT (ms)")
    ax.set_title(f"{run['config']} decode TPOT by logprobs setting and path ({run['gpu']})")
    ax.set_xticks([1, 8, 32], ["1", "8", "32"])
    ax.set_yticks([2, 3, 5, 10, 20, 50], ["2", "3", "5", "10", "20", "50"])
    ax.minorticks_off()
    ax.legend()
    fig.tight_layout()
    fig.savefig(DOCS / "tpot_vs_concurrency.png", dpi=120)


def plot_serving(plt, d: dict) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plain = [r for r in d["rows"] if not r.get("mixed")]
    for (k, path), style in zip(
        [(None, "device"), (1, "device"), (5, "device"), (None, "host"), (1, "host"), (5, "host")],
        ["k-x", "c-o", "b-o", "k--x", "m--s", "r--s"],
    ):
        pts = sorted((r["concurrency"], r["metrics"]["all"]["median_tpot_ms"])
                     for r in plain if r["logprobs"] == k and r["path"] == path)  # fmt: skip
        if pts:
            ax.plot(*zip(*pts), style, label=f"logprobs {'off' if k is None else k}, {path} path server")
    ax.set(xscale="log", yscale="log", xlabel="concurrency (HTTP clients)", ylabel="median TPOT (ms)")
    ax.set_title(f"{d['config']} TPOT seen by HTTP clients ({d['gpu']}, {d['commit']})")
    ax.set_xticks([1, 8, 32], ["1", "8", "32"])
    ax.set_yticks([2, 3, 5, 10, 20, 50, 100], ["2", "3", "5", "10", "20", "50", "100"])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "serving_tpot_vs_concurrency.png", dpi=120)


def plots(stored: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "decode" in stored:
        plot_decode(plt, stored["decode"])
    if stored.get("logprobs"):
        plot_logprobs(plt, stored["logprobs"])
    if "serving" in stored:
        plot_serving(plt, stored["serving"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result_dir", nargs="?", type=Path, help="gpu_check.sh's $OUT, fetched")
    args = parser.parse_args()
    stored = json.loads(STORE.read_text()) if STORE.exists() else {}
    if args.result_dir:
        stored = update(stored, args.result_dir)
        STORE.write_text(json.dumps(stored, indent=1) + "\n")
    write_markdown(stored)
    plots(stored)


if __name__ == "__main__":
    main()
