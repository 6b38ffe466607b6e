"""scripts/bench_serve.py against a fake OpenAI-compatible streaming server with known delays."""

import asyncio
import json
import math
import random
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

web = pytest.importorskip("aiohttp.web")  # the [test] extra has it

from scripts import bench_serve as bench  # noqa: E402

TTFT_S = 0.03  # the fake server's delay before the first token
ITL_S = 0.01  # and between tokens


@dataclass
class FakeState:
    """What the fake server saw: bodies in arrival order, peak requests in flight (all / with logprobs)."""

    fail_every: int | None = None  # request n with n % fail_every == fail_every-1: HTTP 500; -2: an error event
    bodies: list = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    logprobs_in_flight: int = 0
    logprobs_peak: int = 0


def _event(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _chunk(i: int, last: bool, logprobs: int | None) -> dict:
    lp = {"tokens": [f"t{i}"], "token_logprobs": [-0.5], "top_logprobs": [{f"t{i}": -0.5}] * (logprobs or 0)}
    choice = {"index": 0, "text": f"t{i}", "logprobs": lp if logprobs is not None else None}
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{**choice, "finish_reason": "length" if last else None}],
    }


async def _stream(request: web.Request, state: FakeState, body: dict, n: int) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    tokens = body["max_tokens"]
    for i in range(tokens):
        await asyncio.sleep(TTFT_S if i == 0 else ITL_S)
        if state.fail_every and n % state.fail_every == state.fail_every - 2 and i == 2:
            await resp.write(_event({"error": {"message": "boom", "code": 500}}))
            return resp
        await resp.write(_event(_chunk(i, i == tokens - 1, body.get("logprobs"))))
    usage = {
        "prompt_tokens": len(body["prompt"]),
        "completion_tokens": tokens,
        "total_tokens": len(body["prompt"]) + tokens,
    }
    await resp.write(_event({"id": "cmpl-1", "choices": [], "usage": usage}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _app(state: FakeState) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-qwen3", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = len(state.bodies)
        state.bodies.append(body)
        if state.fail_every and n % state.fail_every == state.fail_every - 1:
            return web.json_response({"error": {"message": "overloaded"}}, status=500)
        lp = body.get("logprobs") is not None
        state.in_flight += 1
        state.logprobs_in_flight += lp
        state.peak = max(state.peak, state.in_flight)
        state.logprobs_peak = max(state.logprobs_peak, state.logprobs_in_flight)
        try:
            return await _stream(request, state, body, n)
        finally:
            state.in_flight -= 1
            state.logprobs_in_flight -= lp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


@asynccontextmanager
async def fake_server(**kwargs):
    state = FakeState(**kwargs)
    runner = web.AppRunner(_app(state))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", state
    finally:
        await runner.cleanup()


def _config(url: str, **kwargs) -> bench.BenchConfig:
    defaults = dict(base_url=url, num_prompts=20, input_len=16, output_len=6, vocab_size=1000, max_concurrency=4)
    return bench.BenchConfig(**{**defaults, **kwargs})


def test_random_prompts_follow_range_ratio_and_vocab():
    cfg = bench.BenchConfig(num_prompts=200, input_len=100, output_len=20, range_ratio=0.5, vocab_size=50)
    specs = bench.sample_requests(cfg)
    assert specs == bench.sample_requests(cfg)  # seeded
    inputs, outputs = [len(s.prompt) for s in specs], [s.output_len for s in specs]
    assert min(inputs) >= 50 and max(inputs) <= 150 and len(set(inputs)) > 20
    assert min(outputs) >= 10 and max(outputs) <= 30
    assert all(0 <= t < 50 for s in specs for t in s.prompt)
    exact = bench.sample_requests(bench.BenchConfig(num_prompts=5, input_len=7, output_len=3))
    assert {len(s.prompt) for s in exact} == {7} and {s.output_len for s in exact} == {3}
    assert max(t for s in exact for t in s.prompt) < bench.QWEN3_REGULAR_VOCAB


def test_percentile_interpolates_like_numpy():
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert bench.percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert bench.percentile([5.0], 99) == 5.0


def test_closed_loop_counts_concurrency_and_timings():
    async def scenario():
        async with fake_server() as (url, state):
            return await bench.run_benchmark(_config(url)), state

    report, state = asyncio.run(scenario())
    m = report["metrics"]["all"]
    assert list(report["metrics"]) == ["all"]
    assert (m["completed"], m["failed"], m["total_output_tokens"], m["total_input_tokens"]) == (20, 0, 120, 320)
    assert state.peak == 4 and report["peak_in_flight"] == 4
    body = state.bodies[0]
    assert body["model"] == "fake-qwen3" and body["ignore_eos"] and body["stream"] and "logprobs" not in body
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 6 and len(body["prompt"]) == 16
    # TTFT >= the server's first delay, ITL/TPOT >= its token gap; sleeps overshoot, so only loose upper bounds.
    assert 1e3 * TTFT_S <= m["mean_ttft_ms"] < 1e3 * TTFT_S + 40
    assert 1e3 * ITL_S * 0.9 <= m["median_itl_ms"] < 1e3 * ITL_S + 20
    assert 1e3 * ITL_S * 0.9 <= m["mean_tpot_ms"] < 1e3 * ITL_S + 20
    assert m["p99_e2el_ms"] >= m["median_e2el_ms"] >= 1e3 * (TTFT_S + 5 * ITL_S)
    req = report["requests"][0]
    assert req["success"] and req["output_tokens"] == req["chunks"] == 6 and len(req["itl"]) == 5
    assert req["tpot"] == pytest.approx((req["latency"] - req["ttft"]) / 5)
    assert m["output_throughput"] == pytest.approx(120 / report["duration_s"])


def test_poisson_arrivals_follow_the_seeded_gaps():
    rate, count = 100.0, 12
    rng = random.Random(7 + 1)  # arrivals() draws its gaps from seed + 1
    gaps = [rng.expovariate(rate) for _ in range(count - 1)]

    async def scenario():
        async with fake_server() as (url, state):
            cfg = _config(url, num_prompts=count, output_len=2, request_rate=rate, max_concurrency=None, seed=7)
            return await bench.run_benchmark(cfg), state

    report, state = asyncio.run(scenario())
    starts = [r["start"] for r in report["requests"]]
    assert report["metrics"]["all"]["completed"] == count
    for i in range(1, count):  # each request is sent no earlier than its scheduled arrival
        assert starts[i] >= sum(gaps[:i]) - 1e-3
    assert starts[-1] < sum(gaps) + 0.5
    assert report["config"]["max_concurrency"] is None


def test_a_callers_requests_go_at_their_own_times():
    """Given specs with times, those requests (not cfg's random dataset) are sent at those times, whatever the rate;
    the warm-up sends them at once."""
    times = [0.0, 0.05, 0.06, 0.2]
    specs = [bench.RequestSpec([1, 2, 3][: i + 1], 2 + i, at) for i, at in enumerate(times)]

    async def scenario():
        async with fake_server() as (url, state):
            cfg = _config(url, request_rate=1000.0, max_concurrency=None, warmup=2)
            return await bench.run_benchmark(cfg, specs), state

    report, state = asyncio.run(scenario())
    assert report["config"]["num_prompts"] == 4 and report["metrics"]["all"]["completed"] == 4
    assert [r["prompt_len"] for r in report["requests"]] == [1, 2, 3, 3]
    assert [r["output_tokens"] for r in report["requests"]] == [2, 3, 4, 5]
    starts = [r["start"] for r in report["requests"]]
    for start, at in zip(starts, times):
        assert at - 1e-3 <= start < at + 0.1
    assert [b["prompt"] for b in state.bodies[:2]] == [[1], [1, 2]]  # the warm-up: the first specs


def test_failures_are_counted_with_their_messages():
    async def scenario():
        async with fake_server(fail_every=5) as (url, state):
            report = await bench.run_benchmark(_config(url, num_prompts=10, max_concurrency=1, model="m"))
        # The server is gone: connection errors are failures too, not exceptions.
        gone = await bench.run_benchmark(_config(url, num_prompts=2, model="m"))
        return report, gone

    report, gone = asyncio.run(scenario())
    m = report["metrics"]["all"]
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (6, 4, 36)
    assert sum("HTTP 500" in e for e in report["errors"]) == 2
    assert sum("error event" in e and "boom" in e for e in report["errors"]) == 2
    assert not any(r["success"] for r in report["requests"] if r["error"])
    assert gone["metrics"]["all"]["failed"] == 2 and gone["metrics"]["all"]["completed"] == 0
    assert gone["metrics"]["all"]["mean_ttft_ms"] == 0.0


def test_one_logprobs_client_among_four_reports_both_groups():
    async def scenario():
        async with fake_server() as (url, state):
            return await bench.run_benchmark(_config(url, logprobs=5, logprobs_clients=1)), state

    report, state = asyncio.run(scenario())
    asked = [b for b in state.bodies if "logprobs" in b]
    assert asked and all(b["logprobs"] == 5 for b in asked) and len(asked) < 20
    assert state.logprobs_peak == 1 and state.peak == 4
    groups = report["metrics"]
    assert set(groups) == {"all", "logprobs", "no_logprobs"}
    assert groups["logprobs"]["completed"] == len(asked)
    assert groups["logprobs"]["completed"] + groups["no_logprobs"]["completed"] == 20


def test_logprobs_every_nth_request():
    cfg = bench.BenchConfig(logprobs=3, logprobs_every=4)
    assert [bench.wants_logprobs(cfg, i, None) for i in range(6)] == [3, None, None, None, 3, None]
    assert bench.wants_logprobs(bench.BenchConfig(), 0, 0) is None
    assert bench.wants_logprobs(bench.BenchConfig(logprobs=0), 5, None) == 0  # logprobs=0 still asks


def test_warmup_is_not_measured_and_a_failing_warmup_aborts():
    async def scenario():
        async with fake_server() as (url, state):
            report = await bench.run_benchmark(_config(url, num_prompts=4, output_len=2, warmup=3))
            sent = len(state.bodies)
        async with fake_server(fail_every=1) as (url, _):
            with pytest.raises(RuntimeError, match="warmup request failed: HTTP 500"):
                await bench.run_benchmark(_config(url, num_prompts=4, warmup=1))
        return report, sent

    report, sent = asyncio.run(scenario())
    assert sent == 7 and report["metrics"]["all"]["completed"] == 4 and len(report["requests"]) == 4


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"

    async def scenario():
        async with fake_server() as (url, _):
            argv = [f"--base-url={url}", "--num-prompts=6", "--input-len=8", "--output-len=3", "--vocab-size=100"]
            argv += ["--max-concurrency=2", "--logprobs=2", "--logprobs-every=2", "--percentiles=50,90,99.9"]
            return await asyncio.to_thread(bench.main, [*argv, "--request-rate=200", f"--out={out}"])

    assert asyncio.run(scenario()) == 0
    text = capsys.readouterr().out
    assert "Serving Benchmark Result" in text and "P99.9 TTFT (ms):" in text and "requests: logprobs" in text
    report = json.loads(out.read_text())
    assert set(report) == {"date", "config", "duration_s", "peak_in_flight", "metrics", "errors", "requests"}
    assert report["config"]["percentiles"] == [50.0, 90.0, 99.9] and report["config"]["model"] == "fake-qwen3"
    assert "p99.9_itl_ms" in report["metrics"]["all"] and report["metrics"]["logprobs"]["completed"] == 3
    assert [r["logprobs"] for r in report["requests"]] == [2, None] * 3
    assert math.isfinite(report["config"]["request_rate"])


def test_cli_rejects_logprobs_clients_without_concurrency():
    with pytest.raises(SystemExit):
        bench.parse_args(["--logprobs=1", "--logprobs-clients=1"])
    assert bench.parse_args([]).request_rate == math.inf
