"""Soak test of a running `qwen3-runtime serve`: a bounded mix of requests with faults injected, then
checks, printed as figures (exit status 1 if any fails):

- every request got a complete response or a clear error, none hung past the per-request deadline; bad
  requests got a 400 naming the parameter;
- greedy and seeded outputs equal the offline Runtime's for the same request (scripts/soak/replay.py);
- with no request left, every KV block is free and both processes' resident memory and the engine's GPU memory
  are back within a bound of where they were after a warm-up;
- latency percentiles and throughput.

Usage: python -m scripts.soak --url http://127.0.0.1:8000 --config tiny --set engine.num_kv_blocks=48 \\
           --requests 300 --concurrency 16 --out soak.json
`--config` / `--set` must be the server's, for the offline replay; with `--serve LOG` the soak starts that server
itself (on a free loopback port, its output to LOG) and stops it at the end. A run longer than one sitting splits
in two: `--save FILE --replay-max 0` keeps what the load saw, then `--replay-from FILE` replays and checks it."""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import sys
import time
from pathlib import Path

import httpx

from qwen3_runtime.cli import parse_override
from qwen3_runtime.config import load_config
from scripts.bench_serving import server
from scripts.soak.client import Result, send
from scripts.soak.replay import replay
from scripts.soak.report import Checks, leak_checks, read_metrics, summarize, wait_idle
from scripts.soak.workload import Limits, Workload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.soak", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (loopback only)")
    p.add_argument("--serve", type=Path, default=None, metavar="LOG", help="start the server (--config, --set)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--config", default="tiny", help="the server's config, for the replay")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the server's overrides")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--burst-every", type=int, default=50, help="a burst after every N requests (0: none)")
    p.add_argument("--burst-size", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=48, help="most requests' output budget")
    p.add_argument("--deadline", type=float, default=120.0, help="seconds per request before it counts as hung")
    p.add_argument("--duration-limit", type=float, default=1800.0, help="stop sending new requests after S s")
    p.add_argument("--tol", type=float, default=1e-4, help="logprobs' absolute tolerance in the replay")
    p.add_argument(
        "--tie-tol", type=float, default=1e-4, help="a greedy output may diverge where the top two are this close"
    )
    p.add_argument(
        "--replay-group", type=int, default=1, help="requests the offline Runtime runs together (1: each alone)"
    )
    p.add_argument("--replay-max", type=int, default=-1, help="replay the first N reproducible requests (-1: all)")
    p.add_argument("--rss-growth", type=float, default=0.10, help="allowed RSS growth, a fraction ...")
    p.add_argument("--rss-growth-mb", type=float, default=200.0, help="... or MB, whichever is larger")
    p.add_argument("--gpu-growth-mb", type=float, default=64.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", type=Path, default=None, help="keep the load's results and metrics (pickle)")
    p.add_argument("--replay-from", type=Path, default=None, help="no load: replay and check a --save file")
    p.add_argument("--out", default=None, help="write the figures and mismatches as JSON")
    args = p.parse_args(argv)
    if httpx.URL(args.url).host not in ("127.0.0.1", "localhost", "::1"):
        p.error("--url must be a loopback address")
    return args


async def run_load(client: httpx.AsyncClient, work: Workload, args: argparse.Namespace) -> tuple[list[Result], float]:
    """Sends args.requests requests, args.concurrency at a time, a burst (all at once) every burst_every."""
    sem = asyncio.Semaphore(args.concurrency)
    t0 = time.perf_counter()

    async def one(spec) -> Result:
        if spec.burst:
            return await send(client, spec, args.deadline)
        async with sem:
            return await send(client, spec, args.deadline)

    tasks, index = [], 0
    while index < args.requests and time.perf_counter() - t0 < args.duration_limit:
        specs = [work.spec(index)]
        if args.burst_every and index % args.burst_every == args.burst_every - 1:
            specs += work.burst(index + 1, args.burst_size)
        for spec in specs:
            if spec.burst:
                await sem.acquire()  # a burst starts once the steady load has room for one more
                sem.release()
            tasks.append(asyncio.create_task(one(spec)))
        index += len(specs)
        while sum(not t.done() for t in tasks) >= args.concurrency + args.burst_size:
            await asyncio.sleep(0.005)
    results = list(await asyncio.gather(*tasks))
    return results, time.perf_counter() - t0


async def soak(args: argparse.Namespace) -> tuple[list[Result], float, dict, dict]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    pool = httpx.Limits(max_connections=args.concurrency + args.burst_size + 4)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=args.deadline, limits=pool) as client:
        card = (await client.get("/v1/models")).json()["data"][0]
        work = Workload(model_limits(args, card["max_model_len"]), args.seed, card["id"])
        warm = [work.completion(-1 - i) for i in range(4)]
        await asyncio.gather(*(send(client, s, args.deadline) for s in warm))
        await wait_idle(client, 60.0)
        before = await read_metrics(client)
        results, wall = await run_load(client, work, args)
        after = await wait_idle(client, 60.0)
    return results, wall, before, after


def overrides(args: argparse.Namespace) -> dict:
    return dict(parse_override(s) for s in args.set)


def model_limits(args: argparse.Namespace, max_model_len: int) -> Limits:
    """The config's limits, with the server's max_model_len (the config may leave it to the model and its cache)."""
    cfg = load_config(args.config, overrides(args))
    vocab = cfg.model.architecture.vocab_size if cfg.model.architecture else 151936  # Qwen3's
    return Limits(max_model_len, vocab, cfg.logprobs.max_logprobs, args.max_tokens)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replay_from is not None:
        results, wall, before, after = pickle.loads(args.replay_from.read_bytes())
    elif args.serve is not None:
        with server(args.config, "device", args.set, args.serve) as args.url:
            results, wall, before, after = asyncio.run(soak(args))
    else:
        results, wall, before, after = asyncio.run(soak(args))
    if args.save is not None:
        args.save.write_bytes(pickle.dumps((results, wall, before, after)))
    t = time.perf_counter()
    comparer = None  # --replay-max 0: a load kept (--save) to be replayed later
    if args.replay_max != 0:
        comparer = replay(
            results, args.config, overrides(args), args.tol, args.tie_tol, args.replay_group, args.replay_max
        )
    replay_s = time.perf_counter() - t
    checks = Checks()
    figures = summarize(results, wall, comparer, checks)
    figures["leaks"] = leak_checks(before, after, args, checks)
    figures["replay_s"] = round(replay_s, 1)
    print(f"\nload {wall:.0f} s, replay {replay_s:.0f} s")
    checks.print()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"figures": figures, "checks": checks.rows}, f, indent=1, default=str)
    return 0 if checks.passed else 1


if __name__ == "__main__":
    sys.exit(main())
