r"""Load generator for an OpenAI-compatible /v1/completions server, with the semantics of `vllm bench serve`
(random dataset), so our server's numbers compare with vLLM's own client.

Random prompts are token-id lists (exact input lengths), lengths uniform in [L*(1-r), L*(1+r)]; every request
streams exactly its output length (max_tokens with ignore_eos). Requests arrive all at once (--request-rate inf)
or as a Poisson process, at most --max-concurrency in flight. Reports TTFT, TPOT, ITL and E2EL, throughput,
and, when only some requests ask for logprobs, the same metrics for each group.

Usage: python -m scripts.bench_serve --input-len 1024 --output-len 128 --num-prompts 200 --max-concurrency 8 \
    --logprobs 5 --logprobs-clients 1 --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace

import aiohttp
import uvloop
from pydantic_core import from_json

# Qwen3's regular tokens are ids 0..151642; 151643 on are special (<|endoftext|>, <|im_start|>, ...).
QWEN3_REGULAR_VOCAB = 151643
METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_TITLES = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}


@dataclass
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the first model GET /v1/models lists
    api_key: str | None = None
    num_prompts: int = 100
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    vocab_size: int = QWEN3_REGULAR_VOCAB
    request_rate: float = math.inf
    max_concurrency: int | None = None
    logprobs: int | None = None
    logprobs_every: int = 1
    logprobs_clients: int | None = None
    seed: int = 0
    warmup: int = 0
    percentiles: list[float] = field(default_factory=lambda: [50.0, 99.0])
    timeout_s: float = 6 * 3600
    out: str | None = None


@dataclass
class RequestSpec:
    prompt: list[int]
    output_len: int
    at: float | None = None  # when to send it, in seconds from the run's start (a caller's own arrivals)


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds from when it was sent (after its concurrency slot)."""

    prompt_len: int
    output_len: int  # requested (max_tokens)
    logprobs: int | None = None
    success: bool = False
    error: str | None = None
    output_tokens: int = 0  # usage.completion_tokens, else the number of content chunks
    chunks: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start: float = 0.0  # seconds since the benchmark started

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def _lengths(rng: random.Random, mean: int, ratio: float, count: int) -> list[int]:
    """vLLM's random dataset: integer lengths uniform in [mean*(1-r), mean*(1+r)], at least 1."""
    low, high = max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))
    return [rng.randint(low, high) for _ in range(count)]


def sample_requests(cfg: BenchConfig) -> list[RequestSpec]:
    """Random token-id prompts below --vocab-size (Qwen3's special tokens start at 151643), seeded."""
    rng = random.Random(cfg.seed)
    inputs = _lengths(rng, cfg.input_len, cfg.range_ratio, cfg.num_prompts)
    outputs = _lengths(rng, cfg.output_len, cfg.range_ratio, cfg.num_prompts)
    return [
        RequestSpec([rng.randrange(cfg.vocab_size) for _ in range(n_in)], n_out) for n_in, n_out in zip(inputs, outputs)
    ]


async def arrivals(specs: list[RequestSpec], rate: float, seed: int) -> AsyncIterator[int]:
    """Request indices at the specs' own times when they have them, else at a Poisson rate (exponential gaps), or
    all at once when the rate is infinite."""
    rng = random.Random(seed + 1)  # its own stream: changing the rate leaves the prompts alone
    start = time.perf_counter()
    for index, spec in enumerate(specs):
        if spec.at is not None:
            await asyncio.sleep(max(0.0, start + spec.at - time.perf_counter()))
        yield index
        if spec.at is None and math.isfinite(rate) and index + 1 < len(specs):
            await asyncio.sleep(rng.expovariate(rate))


class SlotPool:
    """A semaphore that also says which of its slots a request holds, so "one logprobs client out of 8" can be
    the requests that run in slot 0; counts the peak in flight."""

    def __init__(self, size: int | None):
        self._free: asyncio.Queue[int] | None = None
        if size is not None:
            self._free = asyncio.Queue()
            for slot in range(size):
                self._free.put_nowait(slot)
        self.in_flight = 0
        self.peak = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[int | None]:
        slot = await self._free.get() if self._free is not None else None
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            yield slot
        finally:
            self.in_flight -= 1
            if self._free is not None:
                self._free.put_nowait(slot)


def wants_logprobs(cfg: BenchConfig, index: int, slot: int | None) -> int | None:
    """The logprobs K this request asks for: every --logprobs-every'th request, or those in the first
    --logprobs-clients concurrency slots."""
    if cfg.logprobs is None:
        return None
    if cfg.logprobs_clients is not None:
        return cfg.logprobs if slot is not None and slot < cfg.logprobs_clients else None
    return cfg.logprobs if index % cfg.logprobs_every == 0 else None


def build_payload(cfg: BenchConfig, spec: RequestSpec, logprobs: int | None) -> dict:
    payload = {
        "model": cfg.model,
        "prompt": spec.prompt,
        "max_tokens": spec.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if logprobs is not None:
        payload["logprobs"] = logprobs
    return payload


def _headers(cfg: BenchConfig) -> dict:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


async def _read_stream(resp: aiohttp.ClientResponse, result: RequestResult, sent: float) -> None:
    """Parse the SSE stream: every chunk with choices is one content chunk (as vLLM's client counts them);
    usage gives the token count; an error event or a stream without [DONE] fails the request."""
    last = sent
    async for raw in resp.content:
        if not raw.startswith(b"data:"):
            continue  # blank separators, ": keep-alive" comments
        data = raw[len(b"data:") :].strip()
        if data == b"[DONE]":
            result.latency = time.perf_counter() - sent
            result.output_tokens = result.output_tokens or result.chunks
            result.success = result.chunks > 0
            result.error = None if result.success else "no content chunks before [DONE]"
            return
        event = from_json(data)  # pydantic's Rust parser: the client's per-chunk cost stays small beside the server's
        now = time.perf_counter()
        if event.get("error"):
            result.error = f"error event: {json.dumps(event['error'])[:500]}"
            return
        if event.get("choices"):
            if result.chunks == 0:
                result.ttft = now - sent
            else:
                result.itl.append(now - last)
            last = now
            result.chunks += 1
        if event.get("usage"):
            result.output_tokens = event["usage"].get("completion_tokens") or 0
    result.error = "stream ended without [DONE]"


async def send_request(
    session: aiohttp.ClientSession, cfg: BenchConfig, spec: RequestSpec, logprobs: int | None, t0: float
) -> RequestResult:
    """One streamed completion; any failure (HTTP status, error event, connection) is kept as its message."""
    result = RequestResult(prompt_len=len(spec.prompt), output_len=spec.output_len, logprobs=logprobs)
    sent = time.perf_counter()
    result.start = sent - t0
    url = cfg.base_url.rstrip("/") + "/v1/completions"
    try:
        async with session.post(url, json=build_payload(cfg, spec, logprobs), headers=_headers(cfg)) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
            else:
                await _read_stream(resp, result, sent)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:  # ValueError: bad JSON, bytes, long line
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def fetch_model(session: aiohttp.ClientSession, cfg: BenchConfig) -> str:
    async with session.get(cfg.base_url.rstrip("/") + "/v1/models", headers=_headers(cfg)) as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]["id"]


async def _run_all(
    session: aiohttp.ClientSession, cfg: BenchConfig, specs: list[RequestSpec], pool: SlotPool, rate: float
) -> list[RequestResult]:
    """Dispatch specs at the given rate; each request waits for a slot, then is timed from when it is sent."""
    t0 = time.perf_counter()

    async def one(index: int) -> RequestResult:
        async with pool.slot() as slot:
            return await send_request(session, cfg, specs[index], wants_logprobs(cfg, index, slot), t0)

    tasks = [asyncio.create_task(one(index)) async for index in arrivals(specs, rate, cfg.seed)]
    return list(await asyncio.gather(*tasks))


def benchmark(cfg: BenchConfig, specs: list[RequestSpec] | None = None) -> dict:
    """run_benchmark on uvloop, as the server runs: the client's own cost per chunk must not be what it measures."""
    return uvloop.run(run_benchmark(cfg, specs))


async def run_benchmark(cfg: BenchConfig, specs: list[RequestSpec] | None = None) -> dict:
    """Warm up (not measured; any failure aborts, so a wrong URL fails fast), then run and summarize. `specs`: the
    requests to send (a caller's own workload), instead of cfg's random dataset; cfg.num_prompts then follows them."""
    if specs is None:
        specs = sample_requests(cfg)
    else:
        cfg = replace(cfg, num_prompts=len(specs))
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or 0)  # aiohttp's default 100 would cap concurrency
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if cfg.model is None:
            cfg.model = await fetch_model(session, cfg)
        if cfg.warmup:
            warm = [replace(specs[i % len(specs)], at=None) for i in range(cfg.warmup)]  # all at once
            failed = [r.error for r in await _run_all(session, cfg, warm, SlotPool(cfg.max_concurrency), math.inf)]
            if any(failed):
                raise RuntimeError(f"warmup request failed: {next(e for e in failed if e)}")
        pool = SlotPool(cfg.max_concurrency)
        start = time.perf_counter()
        results = await _run_all(session, cfg, specs, pool, cfg.request_rate)
        duration = time.perf_counter() - start
    return build_report(cfg, results, duration, pool.peak)


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without needing numpy."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _pkey(p: float) -> str:
    return f"p{int(p) if float(p).is_integer() else p}"


def _stats(name: str, values_s: list[float], percentiles: list[float]) -> dict:
    """vLLM's keys: mean_ttft_ms, median_ttft_ms, std_ttft_ms, p99_ttft_ms, ... (0 when there are no values)."""
    ms = [1e3 * v for v in values_s] or [0.0]
    out = {
        f"mean_{name}_ms": statistics.fmean(ms),
        f"median_{name}_ms": statistics.median(ms),
        f"std_{name}_ms": statistics.pstdev(ms),
    }
    out.update({f"{_pkey(p)}_{name}_ms": percentile(ms, p) for p in percentiles})
    return out


def summarize(results: list[RequestResult], duration: float, percentiles: list[float]) -> dict:
    """Aggregate metrics of a group of requests; throughputs are over the whole run's duration."""
    ok = [r for r in results if r.success]
    inputs, outputs = sum(r.prompt_len for r in ok), sum(r.output_tokens for r in ok)
    metrics = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "request_throughput": len(ok) / duration,
        "output_throughput": outputs / duration,
        "total_token_throughput": (inputs + outputs) / duration,
    }
    values = {
        "ttft": [r.ttft for r in ok],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    for name in METRICS:
        metrics.update(_stats(name, values[name], percentiles))
    return metrics


def build_report(cfg: BenchConfig, results: list[RequestResult], duration: float, peak: int) -> dict:
    """Config, aggregate metrics ("all", plus "logprobs"/"no_logprobs" when mixed) and per-request raw data."""
    groups = {"all": results}
    with_lp = [r for r in results if r.logprobs is not None]
    if with_lp and len(with_lp) < len(results):
        groups.update(logprobs=with_lp, no_logprobs=[r for r in results if r.logprobs is None])
    config = asdict(cfg)
    config["request_rate"] = str(cfg.request_rate) if math.isinf(cfg.request_rate) else cfg.request_rate
    requests = [{**asdict(r), "tpot": r.tpot} for r in results]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "config": config,
        "duration_s": duration,
        "peak_in_flight": peak,
        "metrics": {name: summarize(group, duration, cfg.percentiles) for name, group in groups.items()},
        "errors": [r.error for r in results if r.error],
        "requests": requests,
    }


def _row(label: str, value: object) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{label:<40}{text:<10}"


def format_group(metrics: dict, percentiles: list[float]) -> list[str]:
    lines = [
        _row("Successful requests:", metrics["completed"]),
        _row("Failed requests:", metrics["failed"]),
        _row("Total input tokens:", metrics["total_input_tokens"]),
        _row("Total generated tokens:", metrics["total_output_tokens"]),
        _row("Request throughput (req/s):", metrics["request_throughput"]),
        _row("Output token throughput (tok/s):", metrics["output_throughput"]),
        _row("Total Token throughput (tok/s):", metrics["total_token_throughput"]),
    ]
    for name in METRICS:
        lines.append(f"{METRIC_TITLES[name]:-^50}")
        upper = name.upper()
        lines.append(_row(f"Mean {upper} (ms):", metrics[f"mean_{name}_ms"]))
        lines.append(_row(f"Median {upper} (ms):", metrics[f"median_{name}_ms"]))
        shown = [p for p in percentiles if p != 50]  # p50 is the median, already printed (the JSON keeps both)
        lines += [_row(f"P{_pkey(p)[1:]} {upper} (ms):", metrics[f"{_pkey(p)}_{name}_ms"]) for p in shown]
    return lines


def format_report(report: dict) -> str:
    """vLLM-style table, one block per group."""
    cfg = report["config"]
    lines = [
        "{s:{c}^50}".format(s=" Serving Benchmark Result ", c="="),
        _row("Maximum request concurrency:", cfg["max_concurrency"]),
        _row("Request rate (req/s):", cfg["request_rate"]),
        _row("Peak requests in flight:", report["peak_in_flight"]),
        _row("Benchmark duration (s):", report["duration_s"]),
    ]
    for name, metrics in report["metrics"].items():
        if len(report["metrics"]) > 1:
            lines.append(f"{' requests: ' + name + ' ':=^50}")
        lines += format_group(metrics, cfg["percentiles"])
    lines.append("=" * 50)
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=BenchConfig.base_url)
    p.add_argument("--model", default=None, help="name sent in the body (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--num-prompts", type=int, default=BenchConfig.num_prompts)
    p.add_argument("--input-len", type=int, default=BenchConfig.input_len)
    p.add_argument("--output-len", type=int, default=BenchConfig.output_len)
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [L*(1-r), L*(1+r)]")
    p.add_argument("--vocab-size", type=int, default=QWEN3_REGULAR_VOCAB, help="prompt ids are below this")
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson rate in req/s; inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--logprobs", type=int, default=None, help="top-K logprobs for the requests that ask")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--logprobs-every", type=int, default=1, help="every Nth request asks for logprobs")
    who.add_argument("--logprobs-clients", type=int, default=None, help="requests in the first N slots ask")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0, help="requests sent first, not measured")
    p.add_argument("--percentiles", default="50,99", help="comma-separated, e.g. 50,90,99")
    p.add_argument("--timeout-s", type=float, default=BenchConfig.timeout_s)
    p.add_argument("--out", default=None, help="write the JSON report here")
    args = p.parse_args(argv)
    if args.logprobs_clients is not None and args.max_concurrency is None:
        p.error("--logprobs-clients needs --max-concurrency (clients are concurrency slots)")
    if args.logprobs_every < 1 or args.num_prompts < 1:
        p.error("--logprobs-every and --num-prompts must be at least 1")
    args.percentiles = [float(x) for x in args.percentiles.split(",") if x.strip()]
    return BenchConfig(**vars(args))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    report = benchmark(cfg)
    print(format_report(report))
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["metrics"]["all"]["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
