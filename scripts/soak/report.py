"""The soak's checks and figures: outcomes by kind, bad requests, mismatches, leaks, latency, throughput."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from scripts.report import unlabelled_samples
from scripts.soak.client import Result
from scripts.soak.replay import Comparer

P = "qwen3_runtime_"
MB = 1 << 20


class Checks:
    def __init__(self) -> None:
        self.rows: list[tuple[str, bool, str]] = []

    def add(self, name: str, ok: bool, figure: str) -> None:
        self.rows.append((name, bool(ok), figure))

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.rows)

    def print(self) -> None:
        print("\nchecks")
        for name, ok, figure in self.rows:
            print(f"  {'PASS' if ok else 'FAIL'}  {name:<38} {figure}")
        print("soak:", "PASSED" if self.passed else "FAILED")


async def read_metrics(client: httpx.AsyncClient) -> dict[str, float]:
    """/metrics' unlabelled samples by name."""
    return unlabelled_samples((await client.get("/metrics")).text)


async def wait_idle(client: httpx.AsyncClient, timeout: float) -> dict[str, float]:
    """/metrics once the engine has no request running or waiting (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        m = await read_metrics(client)
        if m.get(P + "num_requests_running") == 0 == m.get(P + "num_requests_waiting"):
            return m
        if time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.2)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def summarize(results: list[Result], wall: float, comparer: Comparer | None, checks: Checks) -> dict:
    by_kind = Counter((r.spec.kind, r.outcome) for r in results)
    print(f"{'kind':<32} outcomes")
    for kind in sorted({k for k, _ in by_kind}):
        print(f"  {kind:<30} " + ", ".join(f"{o} {n}" for (k, o), n in sorted(by_kind.items()) if k == kind))
    outcomes = Counter(r.outcome for r in results)
    broken = [r for r in results if r.outcome in ("hung", "incomplete", "unexpected")]
    checks.add("complete or clear error, none hung", not broken, f"{len(broken)} of {len(results)}")
    for r in broken[:5]:
        print(f"  request {r.spec.index} {r.spec.kind}: {r.outcome}: {r.detail}")
    errors = [r for r in results if not r.spec.bad_param and r.outcome in ("error", "rejected")]
    checks.add("no error on a valid request", not errors, f"{len(errors)}")
    for r in errors[:5]:
        print(f"  request {r.spec.index} {r.spec.kind}: status {r.status}: {r.detail}\n    body {r.spec.body}")
    bad = [r for r in results if r.spec.bad_param]
    named = [r for r in bad if r.outcome == "rejected" and r.error_param == r.spec.bad_param]
    checks.add("bad requests: 400 naming the parameter", len(named) == len(bad), f"{len(named)} of {len(bad)}")
    for r in [r for r in bad if r not in named][:5]:
        print(f"  bad {r.spec.bad_param}: {r.outcome} status {r.status} param {r.error_param}: {r.detail}")
    if comparer is None:
        print("replay: not run (--replay-max 0)")
    else:
        checks.add(
            "replay: outputs equal the offline engine's",
            not comparer.mismatches and comparer.tokens > 0,
            f"{len(comparer.mismatches)} mismatches; {comparer.tokens} tokens, {comparer.logprobs} logprobs compared; "
            f"{comparer.diverged} greedy outputs diverged at a near-tie",
        )
    for m in comparer.mismatches[:8] if comparer else []:
        print(
            f"  request {m.request} choice {m.choice} {m.what}:\n    server  {m.got!r:.300}\n    offline {m.want!r:.300}"
        )
    figures = _latency(results, wall, outcomes) | {"by_kind": {f"{k} {o}": n for (k, o), n in by_kind.items()}}
    if comparer is not None:
        figures["mismatches"] = comparer.summary()
        print(f"mismatches: {figures['mismatches']}")
        figures["logprob_differences"] = comparer.difference_quantiles()
        print(
            "logprob |server - offline|: "
            + ", ".join(f"{q} {v:.2e}" for q, v in figures["logprob_differences"].items())
        )
    return figures


def _latency(results: list[Result], wall: float, outcomes: Counter) -> dict:
    ok = [r for r in results if r.outcome == "ok"]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok]
    tokens = sum(r.completion_tokens for r in ok)
    fig = {
        "requests": len(results),
        "outcomes": dict(outcomes),
        "wall_s": round(wall, 2),
        "ttft_ms_p50": pct(ttft, 0.5),
        "ttft_ms_p99": pct(ttft, 0.99),
        "e2e_ms_p50": pct(e2e, 0.5),
        "e2e_ms_p99": pct(e2e, 0.99),
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": tokens / wall,
    }
    print(f"\nrequests {len(results)} in {wall:.1f} s: " + ", ".join(f"{o} {n}" for o, n in outcomes.items()))
    print(f"TTFT p50 {fig['ttft_ms_p50']:.0f} ms  p99 {fig['ttft_ms_p99']:.0f} ms (streamed, {len(ttft)})")
    print(f"E2E  p50 {fig['e2e_ms_p50']:.0f} ms  p99 {fig['e2e_ms_p99']:.0f} ms ({len(e2e)})")
    print(f"throughput {fig['requests_per_s']:.1f} req/s, {fig['output_tokens_per_s']:.0f} output tok/s")
    return fig


def leak_checks(before: dict, after: dict, args, checks: Checks) -> dict:
    idle = after.get(P + "num_requests_running") == 0 == after.get(P + "num_requests_waiting")
    checks.add("idle after the run", idle, f"running {after.get(P + 'num_requests_running')}")
    free, total = after.get(P + "kv_blocks_free", -1), after.get(P + "kv_blocks_total", 0)
    checks.add("KV blocks: all free (none leaked)", total > 0 and free == total, f"{free:.0f} free of {total:.0f}")
    fig = {"kv_blocks_free": free, "kv_blocks_total": total, "preemptions": after.get(P + "num_preemptions_total", 0)}
    print(f"preemptions during the run: {fig['preemptions']:.0f}")
    for proc in ("engine", "api"):
        name = f"{P}{proc}_resident_memory_bytes"
        b, a = before.get(name, 0), after.get(name, 0)
        bound = max(args.rss_growth * b, args.rss_growth_mb * MB)
        checks.add(f"{proc} RSS growth within {bound / MB:.0f} MB", b > 0 and a - b <= bound, _mb(b, a))
        fig[f"{proc}_rss_mb"] = (b / MB, a / MB)
    name = P + "engine_gpu_memory_allocated_bytes"
    b, a = before.get(name, 0), after.get(name, 0)
    checks.add(f"GPU memory growth within {args.gpu_growth_mb:.0f} MB", a - b <= args.gpu_growth_mb * MB, _mb(b, a))
    fig["gpu_allocated_mb"] = (b / MB, a / MB)
    return fig


def _mb(b: float, a: float) -> str:
    return f"{b / MB:.0f} MB -> {a / MB:.0f} MB ({(a - b) / MB:+.1f} MB)"
