"""The logprobs matrix as HTTP clients see it: a server per logprobs path (device, host) on the same config,
bench_serve at concurrency 1 / 8 / 32 with logprobs off / 1 / 5 (greedy, 128-token prompts, 256 output
tokens), a mixed concurrency-8 run with one logprobs=5 client, and the offline API's TPOT on the same
workload, measured in the same run, for the server's overhead. Each cell also records the server's own view
(its /metrics over the run: the engine's time per step, the API process's TPOT), to tell an engine slowdown
from a lag in the API process or the client.

Usage: python -m scripts.bench_serving [--config qwen3-4b] [--quick] --out DIR
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from scripts.bench_serve import BenchConfig, benchmark
from scripts.report import environment, unlabelled_samples

LOGPROBS = [None, 1, 5]
PREFIX = "qwen3_runtime_"


@contextmanager
def server(config: str, path: str, overrides: list[str], log: Path):
    """`qwen3-runtime serve` in a child process on a free port of 127.0.0.1 (its output to `log`), until /health
    answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sets = [arg for o in [f"logprobs.path={path}", *overrides] for arg in ("--set", o)]
    cmd = [sys.executable, "-m", "qwen3_runtime", "serve", "--config", config, "--port", str(port), *sets]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 900  # loading and graph capture
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def serve_cell(url: str, concurrency: int, logprobs: int | None, args, **extra) -> dict:
    """One bench_serve run: `concurrency` requests at once, each of a fixed length (greedy), after a warm-up wave.
    Beside what the clients saw, the server's own view over the run (`server_view`)."""
    cfg = BenchConfig(
        base_url=url, num_prompts=concurrency * args.waves, input_len=args.prompt_len, output_len=args.max_tokens,
        max_concurrency=concurrency, logprobs=logprobs, warmup=0, seed=concurrency, **extra,
    )  # fmt: skip
    benchmark(replace(cfg, num_prompts=concurrency))  # warm-up
    before = scrape(url)
    report = benchmark(cfg)
    server = server_view(before, scrape(url), report["duration_s"])
    return {"concurrency": concurrency, "logprobs": logprobs, "server": server,
            **{k: report[k] for k in ("metrics", "duration_s")}}  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return unlabelled_samples(resp.read().decode())


def server_view(before: dict[str, float], after: dict[str, float], duration_s: float) -> dict:
    """Where a slowdown the clients see arises: the engine's mean time per step over the run (wall time over its
    steps, prefill steps and the ramps at the waves' ends included) and the API process's mean TPOT (as updates
    reach it, before the response is written)."""
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    steps, tpots = delta[f"{PREFIX}engine_steps_total"], delta[f"{PREFIX}time_per_output_token_seconds_count"]
    return {
        "engine_ms_per_step": 1e3 * duration_s / steps if steps else None,
        "api_mean_tpot_ms": 1e3 * delta[f"{PREFIX}time_per_output_token_seconds_sum"] / tpots if tpots else None,
    }


def offline_tpots(config: str, args) -> dict[int, float]:
    """Median TPOT (ms) of the same workload through the Python API, in this process, per concurrency."""
    from qwen3_runtime import Runtime, SamplingParams

    rt = Runtime.from_yaml(config, overrides=dict(o.split("=", 1) for o in args.set) or None)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    tpots = {}
    for c in args.concurrency:
        prompts = np.random.default_rng(c).integers(0, 151643, (c, args.prompt_len)).tolist()
        rt.generate(prompts, params)  # warm-up
        tpots[c] = 1e3 * statistics.median(o.tpot for _ in range(args.waves) for o in rt.generate(prompts, params))
    del rt
    return tpots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="qwen3-4b")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--waves", type=int, default=3, help="requests per client")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--quick", action="store_true", help="32 tokens, one wave")
    parser.add_argument("--paths", nargs="+", default=["device", "host"], choices=["device", "host"])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if args.quick:
        args.max_tokens, args.waves = 32, 1
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"config": args.config, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "rows": []}
    result.update(environment(), waves=args.waves)
    rows = result["rows"]

    def add(row: dict) -> None:  # written after every cell, so a run cut short keeps what it measured
        rows.append(row)
        (args.out / "serving.json").write_text(json.dumps(result, indent=1))

    for path in args.paths:
        with server(args.config, path, args.set, args.out / f"server_{path}.log") as url:
            for c in args.concurrency:
                for k in LOGPROBS:
                    add({"path": path, **serve_cell(url, c, k, args)})
                    view = rows[-1]["server"]
                    print(
                        f"{path} c={c} logprobs={k}: TPOT {rows[-1]['metrics']['all']['median_tpot_ms']:.2f} ms; "
                        f"server: {_ms(view['engine_ms_per_step'])} ms/step, API mean TPOT {_ms(view['api_mean_tpot_ms'])} ms"
                    )
            if path == "device" and 8 in args.concurrency:
                add({"path": path, "mixed": True, **serve_cell(url, 8, 5, args, logprobs_clients=1)})
                others, off = rows[-1]["metrics"]["no_logprobs"], served_off(rows, 8)
                print(f"mixed c=8, one logprobs=5 client: the others' TPOT x{others['median_tpot_ms'] / off:.3f}")
    result["offline_tpot_ms"] = offline_tpots(args.config, args)
    (args.out / "serving.json").write_text(json.dumps(result, indent=1))
    for c, tpot in result["offline_tpot_ms"].items():
        print(f"c={c}: offline TPOT {tpot:.2f} ms, through the server x{served_off(rows, c) / tpot:.3f}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def served_off(rows: list[dict], concurrency: int) -> float:
    """Median TPOT (ms) of the device path's all-off cell at this concurrency."""
    row = next(r for r in rows if r["path"] == "device" and r["concurrency"] == concurrency and r["logprobs"] is None)
    return row["metrics"]["all"]["median_tpot_ms"]


if __name__ == "__main__":
    main()
