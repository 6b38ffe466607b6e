"""Prefill measured four ways, random weights of a real Qwen3 shape, every yardstick measured in
the same run:

shapes    the engine's prefill step per prompts x tokens, against the compute floor (the forward's matmul
          and attention FLOPs at the rate of a large matmul), the weight-read floor (weight bytes at the larger of
          the copy and read bandwidths) and transformers' forward of the same batch (sdpa, logits of the last positions only);
arrivals  Poisson arrivals through the Python API: TTFT, inter-token latency and TPOT for each prefill chunk
          size (engine.max_num_batched_tokens), beside plain decode at the run's median decoding batch; with
          --server the same requests at the same times through `qwen3-runtime serve` too, as bench_serve's
          streaming client sees them;
prefix    a shared system prompt, requests one after another: TTFT of a prefix-cache hit against a miss;
prompt    what prompt logprobs add to a prefill, against the lm_head product over the prompt alone (and what
          reading them from the output costs: it keeps them packed until then).

Usage: python -m scripts.bench_prefill --config qwen3-4b [--parts shapes arrivals prefix prompt] [--quick]
    [--set key=value ...] --out DIR
DIR/prefill.json is rewritten as each part ends, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from qwen3_runtime import RequestOutput, Runtime, SamplingParams
from qwen3_runtime.config import EngineConfig, load_config, parse_override
from scripts.bench_serve import BenchConfig, RequestSpec, benchmark
from scripts.bench_serving import scrape, server, server_view
from scripts.floors import prefill_flops, weight_bytes
from scripts.hf_reference import random_hf_model
from scripts.report import environment
from scripts.timing import matmul_rate, median_ms, stream_bandwidths, synchronize

PARTS = ["shapes", "arrivals", "prefix", "prompt"]
SHAPES = ["1x128", "1x1024", "1x4096", "1x8000", "8x1024", "16x1024", "32x128"]
GREEDY = {"temperature": 0.0, "ignore_eos": True}
TABLES = {  # the columns printed per part (the JSON has more)
    "shapes": ["shape", "ms", "compute_floor_ms", "weight_floor_ms", "vs_compute_floor", "vs_weight_floor", "hf_ms",
               "hf_vs_ours"],
    "arrivals": ["max_num_batched_tokens", "rate", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
                 "itl_max_ms", "tpot_median_ms", "decode_batch_median", "offline_tpot_ms", "ms_per_step",
                 "server_itl_p50_ms", "server_itl_p99_ms", "server_itl_max_ms", "server_tpot_median_ms",
                 "server_ms_per_step"],
    "prefix": ["first_ttft_ms", "hit_ttft_ms", "miss_ttft_ms", "hit_vs_miss", "hit_rate"],
    "prompt": ["prompt_len", "plain_ms", "prompt_logprobs_ms", "extra_ms", "lm_head_ms", "extra_vs_lm_head", "read_ms"],
}  # fmt: skip
# The server's figures a row takes, as (our name, bench_serve's percentile, its metric): server_ttft_p50_ms, ...
SERVED = [("ttft_p50", "p50", "ttft"), ("ttft_p99", "p99", "ttft"), ("itl_p50", "p50", "itl"), ("itl_p99", "p99", "itl"),
          ("itl_max", "p100", "itl"), ("tpot_median", "median", "tpot")]  # fmt: skip


def build(args: argparse.Namespace, overrides: dict) -> Runtime:
    """A fresh Runtime of the config with --set, then the part's own overrides (what it measures depends on
    them), once the previous part's runtime is gone."""
    release()
    return Runtime.from_yaml(args.config, overrides={**args.overrides, **overrides})


def room_for(engine: EngineConfig, tokens: int) -> dict:
    """The override raising engine.max_model_len to hold `tokens`; none where it is null (the model's context)."""
    return {} if engine.max_model_len is None else {"engine.max_model_len": max(engine.max_model_len, tokens)}


def release() -> None:
    """Free what the last runtime or model held (a Runtime holds reference cycles)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompts_of(rng: np.random.Generator, vocab: int, lengths: list[int]) -> list[list[int]]:
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def warm_up(rt: Runtime, rng: np.random.Generator, batches: list[list[int]]) -> None:
    """A few requests (a batch of prompt lengths each) before anything is timed: Triton compiles a kernel
    again for an int argument that is 1, divisible by 16 or neither, so lengths of each kind come through."""
    for lengths in batches:
        rt.generate(prompts_of(rng, rt.vocab_size, lengths), SamplingParams(max_tokens=4, **GREEDY))


def timed_step(rt: Runtime, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list[RequestOutput]]:
    """Wall-clock ms of the rt.step() calls that prefill `prompts` (added beforehand) in one step, sample their
    first tokens and read them (with async scheduling a second call reads the step), the device synchronised
    before and after: scheduling, input staging, the forward, sampling, the copy back; and the outputs."""
    for prompt in prompts:
        rt.add_request(prompt, params)
    steps = engine_steps(rt)
    synchronize(rt.device)
    start = time.perf_counter()
    outs = run_to_end(rt)
    synchronize(rt.device)
    if len(outs) != len(prompts) or engine_steps(rt) != steps + 1:
        raise RuntimeError(f"{len(prompts)} prompts took more than one step")
    return 1e3 * (time.perf_counter() - start), outs


def run_to_end(rt: Runtime) -> list[RequestOutput]:
    outs = []
    while rt.has_unfinished():
        outs += rt.step()
    return outs


def one_step_ms(rt: Runtime, prompts: list[list[int]], params: SamplingParams) -> float:
    return timed_step(rt, prompts, params)[0]


def shapes(args: argparse.Namespace) -> Iterator[dict]:
    """Median ms of the one prefill step per shape (distinct random prompts each time, prefix caching off,
    one step to warm up), then transformers' forward of a batch of the same shape."""
    sizes = [tuple(map(int, s.split("x"))) for s in args.shapes]
    engine = args.cfg.engine
    rt = build(args, {
        "engine.max_num_batched_tokens": max(engine.max_num_batched_tokens, *(b * n for b, n in sizes)),
        **room_for(engine, max(n + 1 for _, n in sizes)),
        "engine.max_num_seqs": max(b for b, _ in sizes),
        "engine.prefix_caching": False,
    })  # fmt: skip
    arch = rt.model.config
    rate, bandwidths, nbytes = matmul_rate(rt.device, rt.dtype), stream_bandwidths(rt.device), weight_bytes(rt.model)
    bandwidth = bandwidths["bandwidth_bytes_s"]
    part = {"matmul_flops_s": rate, **bandwidths, "weight_bytes": nbytes, "rows": []}
    rng, params = np.random.default_rng(args.seed), SamplingParams(max_tokens=1, **GREEDY)
    for b, n in sizes:
        runs = [one_step_ms(rt, prompts_of(rng, rt.vocab_size, [n] * b), params) for _ in range(args.repeats + 1)]
        flops, ms = prefill_flops(arch, [n] * b), statistics.median(runs[1:])
        compute_ms, weight_ms = 1e3 * flops / rate, 1e3 * nbytes / bandwidth
        part["rows"].append({
            "shape": f"{b}x{n}", "prompts": b, "tokens": n, "ms": ms, "ms_runs": runs[1:], "flops": flops,
            "compute_floor_ms": compute_ms, "weight_floor_ms": weight_ms,
            "vs_compute_floor": ms / compute_ms, "vs_weight_floor": ms / weight_ms,
        })  # fmt: skip
        yield part
    device, dtype = rt.device, rt.dtype
    del rt
    if args.no_hf:
        return
    release()
    model = random_hf_model(arch, device=device, dtype=dtype)
    part["hf_attn_implementation"] = model.config._attn_implementation
    for row in part["rows"]:
        ids = torch.randint(0, model.config.vocab_size, (row["prompts"], row["tokens"]), device=device)
        try:
            with torch.inference_mode():
                row["hf_ms"] = median_ms(lambda: model(input_ids=ids, logits_to_keep=1), device, args.repeats)
            row["hf_vs_ours"] = row["hf_ms"] / row["ms"]
        except torch.OutOfMemoryError:
            row["hf_ms"] = None  # does not fit
            torch.cuda.empty_cache()
        yield part


def drive(rt: Runtime, arrivals: list[RequestSpec]) -> tuple[dict[int, float], dict[int, list[float]], list[int]]:
    """One thread: add the requests whose time has come, step, stamp each streamed token with perf_counter()
    as the step that read it returns. Returns each request's scheduled arrival (TTFT counts from it, so a
    request added late counts as waiting), its tokens' stamps, and each decode step's batch (its rows read)."""
    start, queue = time.perf_counter(), deque(arrivals)
    due: dict[int, float] = {}
    stamps: dict[int, list[float]] = {}
    batches = []
    while queue or rt.has_unfinished():
        while queue and start + queue[0].at <= time.perf_counter():
            a = queue.popleft()
            rid = rt.add_request(a.prompt, SamplingParams(max_tokens=a.output_len, **GREEDY), stream=True)
            due[rid], stamps[rid] = start + a.at, []
        if not rt.has_unfinished():
            time.sleep(max(0.0, start + queue[0].at - time.perf_counter()))
            continue
        rt.step()
        now, updates = time.perf_counter(), [u for u in rt.take_updates() if u.token_ids]
        decoded = sum(bool(stamps[u.request_id]) for u in updates)  # rows after a request's first token
        if decoded:
            batches.append(decoded)
        for u in updates:
            stamps[u.request_id] += [now] * len(u.token_ids)
    return due, stamps, batches


def latencies(due: dict[int, float], stamps: dict[int, list[float]]) -> dict:
    ms = lambda values, q: float(1e3 * np.percentile(values, q))
    ttft = [s[0] - due[r] for r, s in stamps.items()]
    gaps = [b - a for s in stamps.values() for a, b in zip(s, s[1:])]
    tpot = [(s[-1] - s[0]) / (len(s) - 1) for s in stamps.values()]
    return {
        "ttft_p50_ms": ms(ttft, 50), "ttft_p99_ms": ms(ttft, 99), "itl_p50_ms": ms(gaps, 50),
        "itl_p99_ms": ms(gaps, 99), "itl_max_ms": ms(gaps, 100), "tpot_median_ms": ms(tpot, 50),
    }  # fmt: skip


def offline_tpot_ms(rt: Runtime, batch: int, prompt_len: int, max_tokens: int, rng: np.random.Generator) -> float:
    """Plain decode at `batch`: that many requests at once, timed while all of them decode, from the step that
    reads the last first token (the batch's prefill, chunked or not, is left out) to the first request's end.
    Each request asks for one more token per prefill step, so that window holds max_tokens steps."""
    max_tokens += -(-batch * prompt_len // rt.config.engine.max_num_batched_tokens)
    arrivals = [RequestSpec(p, max_tokens, 0.0) for p in prompts_of(rng, rt.vocab_size, [prompt_len] * batch)]
    _, stamps, _ = drive(rt, arrivals)
    end = min(s[-1] for s in stamps.values())
    window = [t for t in max(stamps.values(), key=lambda s: s[0]) if t <= end]  # the last one prefilled
    return 1e3 * (window[-1] - window[0]) / (len(window) - 1)


def engine_steps(rt: Runtime) -> int:
    return rt.stats.decode_steps + rt.stats.prefill_steps


def arrivals_at(args: argparse.Namespace, chunk: int) -> list[dict]:
    """A row per --rates at one chunk size, on a runtime of its own (warmed up by a few requests first); with
    --server, then the same requests through a server of the same config."""
    (p_lo, p_hi), (o_lo, o_hi) = args.prompt_range, args.output_range
    overrides = {
        "engine.max_num_batched_tokens": chunk,
        **room_for(args.cfg.engine, p_hi + o_hi),
    }
    rt = build(args, overrides)
    rng = np.random.default_rng(args.seed)
    warm_up(rt, rng, [[p_lo], [p_lo + 1, p_hi - 3]])
    rows, workloads = [], []
    for rate in args.rates:
        at = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, args.num_requests - 1))])
        lengths = rng.integers(p_lo, p_hi + 1, args.num_requests).tolist()
        outputs = rng.integers(o_lo, o_hi + 1, args.num_requests).tolist()
        workloads.append([RequestSpec(*w) for w in zip(prompts_of(rng, rt.vocab_size, lengths), outputs, at)])
        preempted, steps, start = rt.scheduler.num_preemptions, engine_steps(rt), time.perf_counter()
        due, stamps, batches = drive(rt, workloads[-1])
        row = {"max_num_batched_tokens": chunk, "rate": rate, "requests": args.num_requests}
        row |= {"duration_s": time.perf_counter() - start, "preemptions": rt.scheduler.num_preemptions - preempted}
        row["ms_per_step"] = 1e3 * row["duration_s"] / (engine_steps(rt) - steps)
        row |= latencies(due, stamps) | {"decode_batch_median": max(1, round(statistics.median(batches)))}
        row["offline_tpot_ms"] = offline_tpot_ms(
            rt, row["decode_batch_median"], (p_lo + p_hi) // 2, (o_lo + o_hi) // 2, rng
        )
        row["tpot_vs_offline"] = row["tpot_median_ms"] / row["offline_tpot_ms"]
        rows.append(row)
        print(
            f"arrivals: chunk {chunk}, {rate:g}/s: TTFT p50 {row['ttft_p50_ms']:.1f} ms, TPOT {row['tpot_median_ms']:.2f} "
            f"ms vs {row['offline_tpot_ms']:.2f} ms offline at batch {row['decode_batch_median']}",
            flush=True,
        )
    if args.server:
        warm = [RequestSpec(p, o_lo) for p in prompts_of(rng, rt.vocab_size, [p_lo, p_lo + 1, p_hi - 3, p_hi])]
        del rt
        overrides = [*args.set, *(f"{k}={v}" for k, v in overrides.items())]
        served(args, overrides, chunk, warm, zip(rows, workloads))
    return rows


def served(
    args: argparse.Namespace, overrides: list[str], chunk: int, warm: list[RequestSpec], runs: Iterable[tuple]
) -> None:
    """Each row's requests again, at the same times, through `qwen3-runtime serve` (the config with `overrides`; its
    log beside prefill.json), after the `warm` requests (other prompts: the rows' own would hit the prefix cache), as
    bench_serve's streaming client sees them; the figures join the row."""
    release()
    log = args.out / f"server_{chunk}.log"
    with server(args.config, "device", overrides, log) as url:
        send(url, warm, args.seed, log)
        for row, workload in runs:
            before = scrape(url)
            start = time.perf_counter()
            seen = send(url, workload, args.seed, log)
            engine = server_view(before, scrape(url), time.perf_counter() - start)
            row |= {f"server_{k}_ms": seen[f"{p}_{m}_ms"] for k, p, m in SERVED}
            row["server_ms_per_step"] = engine["engine_ms_per_step"]
            row["server_tpot_vs_offline"] = row["server_tpot_median_ms"] / row["offline_tpot_ms"]


def send(url: str, specs: list[RequestSpec], seed: int, log: Path) -> dict:
    """bench_serve's figures for the specs sent at their own times (or all at once); any failure raises."""
    seen = benchmark(BenchConfig(base_url=url, seed=seed, percentiles=[50, 99, 100]), specs)["metrics"]["all"]
    if seen["failed"]:
        raise RuntimeError(f"{seen['failed']} of {len(specs)} requests failed through the server (see {log})")
    return seen


def arrivals(args: argparse.Namespace) -> Iterator[dict]:
    part = {"prompt_range": args.prompt_range, "output_range": args.output_range, "rows": []}
    for chunk in dict.fromkeys([args.cfg.engine.max_num_batched_tokens, *args.chunk_sizes]):
        part["rows"] += arrivals_at(args, chunk)
        yield part


def prefix_ttfts(args: argparse.Namespace, caching: bool) -> dict:
    """TTFT of each request (the shared prompt and a question; the same ones at each call) sent after the
    previous one finished (greedy, --answer-tokens), on a runtime of its own warmed up by unrelated
    requests, and the block manager's hit rate over them (tokens whose KV came from the cache / tokens looked up)."""
    longest = args.system_len + args.question_range[1] + args.answer_tokens
    rt = build(args, {"engine.prefix_caching": caching, **room_for(args.cfg.engine, longest)})
    rng, params = np.random.default_rng(args.seed), SamplingParams(max_tokens=args.answer_tokens, **GREEDY)
    system = prompts_of(rng, rt.vocab_size, [args.system_len])[0]
    lengths = rng.integers(args.question_range[0], args.question_range[1] + 1, args.questions).tolist()
    questions = prompts_of(rng, rt.vocab_size, lengths)
    warm = prompts_of(rng, rt.vocab_size, [args.system_len, args.question_range[1]])
    rt.generate([warm[0]], params)
    rt.generate([warm[0] + warm[1]], params)  # a hit with caching on: a prefill after a cached prefix
    blocks = rt.scheduler.blocks
    queried, hits = blocks.query_tokens, blocks.hit_tokens
    ttfts = [1e3 * rt.generate([system + q], params)[0].ttft for q in questions]
    return {"ttft_ms": ttfts, "hit_rate": (blocks.hit_tokens - hits) / max(1, blocks.query_tokens - queried)}


def prefix(args: argparse.Namespace) -> Iterator[dict]:
    on, off = prefix_ttfts(args, caching=True), prefix_ttfts(args, caching=False)
    hit, miss = statistics.median(on["ttft_ms"][1:]), statistics.median(off["ttft_ms"][1:])
    yield {
        "system_len": args.system_len, "requests": args.questions, "first_ttft_ms": on["ttft_ms"][0],
        "hit_ttft_ms": hit, "miss_ttft_ms": miss, "hit_vs_miss": hit / miss, "hit_rate": on["hit_rate"],
        "ttft_ms_on": on["ttft_ms"], "ttft_ms_off": off["ttft_ms"],
    }  # fmt: skip


def prompt(args: argparse.Namespace) -> Iterator[dict]:
    """The one prefill step of a prompt with and without prompt_logprobs=5, alternating (distinct prompts,
    prefix caching off, the first pair a warm-up), and the lm_head product over its positions alone
    (compute_logits: fp32 output of bf16 operands on the GPU)."""
    n, engine = args.prompt_len, args.cfg.engine
    rt = build(args, {
        "engine.max_num_batched_tokens": max(engine.max_num_batched_tokens, n),
        **room_for(engine, n + 1),
        "engine.prefix_caching": False,
    })  # fmt: skip
    rng, times, reads = np.random.default_rng(args.seed), {None: [], 5: []}, []
    for _ in range(3 * args.repeats + 1):
        for k, ms in times.items():
            params = SamplingParams(max_tokens=1, prompt_logprobs=k, **GREEDY)
            step_ms, outs = timed_step(rt, prompts_of(rng, rt.vocab_size, [n]), params)
            ms.append(step_ms)
            if k is not None:  # the output keeps them packed until read: what reading them costs the reader
                start = time.perf_counter()
                assert len(outs[0].prompt_logprobs) == n
                reads.append(1e3 * (time.perf_counter() - start))
    hidden = torch.randn(n - 1, rt.model.config.hidden_size, device=rt.device, dtype=rt.dtype)
    with torch.inference_mode():
        lm_head_ms = median_ms(lambda: rt.model.compute_logits(hidden), rt.device, 3 * args.repeats)
    plain, scored = statistics.median(times[None][1:]), statistics.median(times[5][1:])
    yield {
        "prompt_len": n, "plain_ms": plain, "prompt_logprobs_ms": scored, "extra_ms": scored - plain,
        "lm_head_ms": lm_head_ms, "extra_vs_lm_head": (scored - plain) / lm_head_ms, "pairs": len(times[5]) - 1,
        "read_ms": statistics.median(reads[1:]),
    }  # fmt: skip


def show(name: str, part: dict) -> None:
    """A short table of a finished part."""
    print(f"== {name}")
    if name == "shapes":
        rate, copy, read = (
            part[k] / 1e12 for k in ("matmul_flops_s", "copy_bandwidth_bytes_s", "read_bandwidth_bytes_s")
        )
        print(
            f"floors: matmul {rate:.3g} TFLOP/s, copy {copy:.3g} TB/s, read {read:.3g} TB/s (bytes at the larger), "
            f"{part['weight_bytes'] / 1e9:.3g} GB of weights"
        )
    rows = part.get("rows", [part])
    keys = [k for k in TABLES[name] if k in rows[0] or k in rows[-1]]
    print(" ".join(f"{k:>{max(8, len(k))}s}" for k in keys))
    for row in rows:
        cell = lambda k, v: f"{v:>{max(8, len(k))}.4g}" if isinstance(v, (int, float)) else f"{v!s:>{max(8, len(k))}s}"
        print(" ".join(cell(k, row.get(k)) for k in keys), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-4b")
    p.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    p.add_argument("--quick", action="store_true", help="3 repetitions, 40 requests, 8 questions, one extra chunk size")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (medians)")
    p.add_argument("--no-hf", action="store_true", help="shapes: skip transformers")
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="shapes: PROMPTSxTOKENS")
    p.add_argument("--rates", type=float, nargs="+", default=[8.0, 16.0], help="arrivals: requests/s")
    p.add_argument(
        "--chunk-sizes", type=int, nargs="*", default=[512, 1024, 2048], help="arrivals: besides the config's"
    )
    p.add_argument("--num-requests", type=int, default=200, help="arrivals: per rate")
    p.add_argument("--prompt-range", type=int, nargs=2, default=[256, 1024], help="arrivals: uniform, inclusive")
    p.add_argument("--output-range", type=int, nargs=2, default=[64, 256], help="arrivals: uniform, inclusive")
    p.add_argument(
        "--server", action="store_true", help="arrivals: the same requests through `qwen3-runtime serve` as well"
    )
    p.add_argument("--system-len", type=int, default=2000, help="prefix: shared prompt tokens")
    p.add_argument("--questions", type=int, default=32, help="prefix: requests")
    p.add_argument("--question-range", type=int, nargs=2, default=[20, 60], help="prefix: tokens after the shared")
    p.add_argument("--answer-tokens", type=int, default=16, help="prefix: greedy tokens per request")
    p.add_argument("--prompt-len", type=int, default=1024, help="prompt: tokens")
    args = p.parse_args(argv)
    if args.output_range[0] < 2 or args.questions < 2 or args.num_requests < 2:
        p.error("--output-range needs at least 2 tokens (an ITL), --questions and --num-requests at least 2")
    if args.quick:
        args.repeats, args.num_requests, args.questions = 3, min(args.num_requests, 40), min(args.questions, 8)
        args.chunk_sizes = args.chunk_sizes[:1]
    args.overrides = dict(parse_override(s) for s in args.set)
    args.cfg = load_config(args.config, args.overrides)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = {"config": args.config, "overrides": args.overrides, "quick": args.quick, **environment()}
    parts = {"shapes": shapes, "arrivals": arrivals, "prefix": prefix, "prompt": prompt}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.parts:
        for partial in parts[name](args):
            result[name] = partial
            (args.out / "prefill.json").write_text(json.dumps(result, indent=2))
        show(name, result[name])
    return result


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    main()
