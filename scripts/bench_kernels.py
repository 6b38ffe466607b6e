"""Per-kernel decisions for the decode step, measured on the GPU (CUDA-graph replay medians, µs):
the Qwen3-4B projections through cuBLAS against ops/linear.py's skinny GEMM, the paged decode
attention's tile size and split count, what engine.batch_invariant's GEMM costs against cuBLAS, the
sampler's passes over a step's [B, 151936] logits (each against greedy's argmax, the pass every step has),
the skinny GEMM's tile widths at 64-128 rows against the L2 traffic each causes (`--parts tiles`), and its weight
bandwidth against how many programs each SM holds (`--parts balance`).

Usage: python -m scripts.bench_kernels --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton

from qwen3_runtime.ops import decode_attention
from qwen3_runtime.ops import linear as skinny
from qwen3_runtime.ops.greedy import greedy_max
from qwen3_runtime.ops.invariant_linear import invariant_linear
from qwen3_runtime.ops.linear import Tiles, linear, linear_partials
from qwen3_runtime.ops.norms import silu_mul
from qwen3_runtime.ops.penalties import PenaltyRows, SlotState, apply_penalties
from qwen3_runtime.params import MAX_LOGIT_BIAS
from qwen3_runtime.sampler import SamplingTensors, filter_cutoffs, sample_raw, sample_selected
from qwen3_runtime.sampling_tail.variant import TOP_K_CAP
from scripts.report import environment
from scripts.timing import graph_us_per_call, read_bandwidth, stream_bandwidths

# Qwen3-4B: (name, out_features, in_features)
SHAPES = [("qkv", 6144, 2560), ("o", 2560, 4096), ("gate_up", 19456, 2560), ("down", 2560, 9728)]
LM_HEAD = ("lm_head", 151936, 2560)
ROTATE_BYTES = 400 * 2**20  # weights cycled per graph so L2 (50 MB) never holds them


def _weights(n: int, k: int) -> list[torch.Tensor]:
    return [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for _ in range(max(2, ROTATE_BYTES // (n * k * 2)))
    ]


def gemm_rows(batches: list[int], bandwidth: float) -> list[dict]:
    """cuBLAS against ops/linear.py: `linear` for the wide projections, split-K `linear_partials` for
    the narrow ones (o_proj, down_proj)."""
    rows = []
    for (name, n, k), m in itertools.product(SHAPES, batches):
        weights = _weights(n, k)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        if name in ("qkv", "gate_up"):
            ours = lambda w: linear(x, w)  # noqa: E731
        else:
            ours = lambda w: linear_partials(x, w)  # noqa: E731
        floor = n * k * 2 / bandwidth * 1e6
        row = {
            "shape": name,
            "n": n,
            "k": k,
            "m": m,
            "floor_us": floor,
            "cublas_us": graph_us_per_call(lambda w: torch.mm(x, w.t(), out=out), weights),
            "ours_us": graph_us_per_call(ours, weights),
        }
        rows.append(row)
        print(
            f"{name:8s} m={m:3d}: floor {floor:6.1f} us  cuBLAS {row['cublas_us']:6.1f} us "
            f"({floor / row['cublas_us']:.0%})  ops.linear {row['ours_us']:6.1f} us "
            f"({floor / row['ours_us']:.0%})",
            flush=True,
        )
        del weights
    return rows


def invariant_rows(batches: list[int]) -> list[dict]:
    """cuBLAS against the batch-invariant GEMM (ops/invariant_linear.py) over decode and prefill row counts; the
    lm_head writes fp32, as the runner's."""
    rows = []
    for (name, n, k), m in itertools.product([*SHAPES, LM_HEAD], batches):
        weights = _weights(n, k)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        dtype = torch.float32 if name == "lm_head" else torch.bfloat16
        if name == "lm_head":
            cublas = graph_us_per_call(lambda w: torch.mm(x, w.t(), out_dtype=torch.float32), weights)
        else:
            cublas = graph_us_per_call(lambda w: torch.mm(x, w.t()), weights)
        ours = graph_us_per_call(lambda w: invariant_linear(x, w, dtype), weights)
        rows.append({"shape": name, "n": n, "k": k, "m": m, "cublas_us": cublas, "invariant_us": ours})
        print(
            f"{name:8s} m={m:4d}: cuBLAS {cublas:7.1f} us ({2 * m * n * k / cublas / 1e6:5.0f} TFLOP/s)  "
            f"invariant {ours:7.1f} us (x{ours / cublas:.2f})",
            flush=True,
        )
        del weights
    return rows


def attention_rows(bandwidth: float) -> list[dict]:
    rows = []
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    heads, kv_heads, dim, block = 32, 8, 128, 16
    default_block_n = decode_attention.BLOCK_N
    for batch, seq_len in itertools.product((1, 8, 32, 64), (256, 1024)):
        blocks_per_row = seq_len // block
        k_cache = torch.randn(batch * blocks_per_row + 1, block, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(batch * blocks_per_row, device="cuda").view(batch, -1).int()
        seq_lens = torch.full((batch,), seq_len, device="cuda", dtype=torch.int32)
        q = [torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        arrivals = torch.zeros(batch, kv_heads, device="cuda", dtype=torch.int32)  # as the runner's: zero between calls
        floor = 2 * k_cache[:-1].numel() * 2 / bandwidth * 1e6
        for block_n, per_sm in itertools.product((16, 32, 64), (1, 2, 4)):
            decode_attention.BLOCK_N = block_n
            splits = decode_attention.default_num_splits(batch, kv_heads, 1024, num_sms, per_sm)
            us = graph_us_per_call(
                lambda x: decode_attention.paged_decode_attention(
                    x, k_cache, v_cache, tables, seq_lens, dim**-0.5, splits, arrivals=arrivals
                ),
                q,
            )
            rows.append(
                {
                    "batch": batch,
                    "seq_len": seq_len,
                    "block_n": block_n,
                    "programs_per_sm": per_sm,
                    "splits": splits,
                    "us": us,
                    "floor_us": floor,
                }
            )
            print(
                f"attention B={batch:2d} L={seq_len:4d} BLOCK_N={block_n:2d} per_sm={per_sm} splits={splits:2d}: "
                f"{us:6.1f} us (floor {floor:5.1f})",
                flush=True,
            )
    decode_attention.BLOCK_N = default_block_n
    return rows


def sampling_rows(batches: list[int]) -> list[dict]:
    """The sampler's passes at Qwen3's vocabulary, the step's own settings (bench_decode's modes): greedy's argmax;
    temperature 0.7's Gumbel pass; top-k 20 + top-p 0.8 sampled among the candidates (graph variant select, the
    peak included); top-p 0.8 alone sampled by the rounds (variant select) and its cutoffs by the sort (variant
    sort, whose Gumbel pass comes on top); the penalties' copy (every row penalized), and with a logit_bias of 32
    tokens a row."""
    rows, vocab = [], LM_HEAD[1]
    for batch in batches:
        logits = [torch.randn(batch, vocab, device="cuda") * 3 for _ in range(4)]
        full = lambda value, dtype: torch.full((batch,), value, device="cuda", dtype=dtype)  # noqa: E731
        params = SamplingTensors(
            full(0.7, torch.float32), full(20, torch.int32), full(0.8, torch.float32),
            torch.arange(batch, device="cuda"), full(128, torch.int64), full(0.0, torch.float32),
        )  # fmt: skip
        top_p_alone = SamplingTensors(**{**vars(params), "top_k": full(-1, torch.int32)})
        no_writes = full(0, torch.int32)
        counts = torch.randint(0, 3, (batch, vocab), device="cuda", dtype=torch.int32)
        bias_ids = torch.zeros(batch, MAX_LOGIT_BIAS, device="cuda", dtype=torch.int32)
        bias_ids[:, :32] = torch.arange(7, vocab, 4_748, device="cuda", dtype=torch.int32)[:32]  # bench_decode's
        slots = SlotState(
            counts, (torch.rand(batch, vocab, device="cuda") < 0.01).to(torch.uint8),
            torch.full((batch, 4), -1, device="cuda", dtype=torch.int32), full(0, torch.int32), bias_ids,
            torch.full((batch, MAX_LOGIT_BIAS), -0.5, device="cuda", dtype=torch.float32),
        )  # fmt: skip
        penalty_rows = PenaltyRows(
            torch.arange(batch, device="cuda", dtype=torch.int32), full(0.2, torch.float32),
            full(0.2, torch.float32), full(1.1, torch.float32), no_writes,
        )  # fmt: skip
        biased = slots._replace(num_bias=full(32, torch.int32))
        parts = {
            "greedy_argmax": lambda x: greedy_max(x),
            "temperature_sample": lambda x: sample_raw(x, params, x.amax(dim=-1), no_writes),
            "top_k_sample": lambda x: sample_selected(x, params, no_writes, x, TOP_K_CAP),
            "top_p_sample": lambda x: sample_selected(x, top_p_alone, no_writes, x, TOP_K_CAP),
            "top_p_sort_cutoffs": lambda x: filter_cutoffs(x, top_p_alone, x.amax(dim=-1)),
            "penalties_copy": lambda x: apply_penalties(x, penalty_rows, slots),
            "penalties_biased": lambda x: apply_penalties(x, penalty_rows, biased),  # 32 logit_bias entries a row
        }
        row = {"batch": batch, **{name: graph_us_per_call(step, logits) for name, step in parts.items()}}
        rows.append(row)
        print(
            f"sampling B={batch:3d}: "
            + "  ".join(f"{name} {us:7.1f} us" for name, us in row.items() if name != "batch"),
            flush=True,
        )
    return rows


def cublas_kernel(x: torch.Tensor, weight: torch.Tensor) -> str:
    """The name of the kernel cuBLAS runs for x @ weight^T (its tile shape and cluster are in it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.mm(x, weight.t())
        torch.cuda.synchronize()
    return "; ".join(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _skinny_launch(x: torch.Tensor, weight: torch.Tensor, tiles: Tiles, splits: int, gated: bool):
    """The skinny kernel launched as given into an output allocated as linear (one slice, x's dtype) or
    linear_partials (fp32 slices of K) allocate theirs; returns (output, the launch over a weight)."""
    k, n_out = weight.shape[1], weight.shape[0] // (2 if gated else 1)
    splits = skinny.nonempty_splits(k, splits, tiles.block_k)
    if splits == 1:
        out = torch.empty(x.shape[0], n_out, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(splits, x.shape[0], n_out, dtype=torch.float32, device=x.device)
    return out, lambda w: skinny._launch(x, w, out, splits, gated=gated, tiles=tiles)


def tile_rows(batches: list[int]) -> list[dict]:
    """The skinny GEMM's tile width against the L2 traffic it causes at 64-128 rows. Each program reads its weight
    tile from DRAM once and the batch's x slice through L2, so x is re-read once per block_n weight rows: L2 serves
    the weights x (1 + rows / block_n), plus fp32 partials written and read back once (by the norm). Beside each,
    cuBLAS (its kernel named: tile shape and cluster) and the runner's own launch; qkv and gate/up as split-K
    partials too, as what-ifs (the next kernel would have to add them). Each launch is checked against cuBLAS."""
    rows, sms = [], torch.cuda.get_device_properties(0).multi_processor_count
    bandwidth = {f"l2_read_{mb}mb": read_bandwidth(mb << 20, 64) for mb in (8, 16, 32)}
    bandwidth["dram_read"] = read_bandwidth(4 << 30, 1)
    print("read bandwidth TB/s: " + "  ".join(f"{k} {bw / 1e12:.2f}" for k, bw in bandwidth.items()), flush=True)
    candidates = [Tiles(64, 128), Tiles(64, 64), Tiles(128, 64, 8, 4), Tiles(128, 128, 8, 3), Tiles(128, 64, 4, 4)]
    for (name, n, k), m in itertools.product(SHAPES, batches):
        weights = _weights(n, k)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        product = torch.mm(x, weights[0].t())
        gated = name == "gate_up"
        expected = silu_mul(product).float() if gated else product.float()
        entry = {"shape": name, "m": m, "weight_bytes": n * k * 2, "cublas_kernel": cublas_kernel(x, weights[0])}
        entry["cublas_us"] = graph_us_per_call(lambda w: torch.mm(x, w.t()), weights)
        entry["launches"] = []
        for tiles in candidates + [Tiles(256, 64, 8, 3)] * (m > 64):
            if gated and tiles.block_k > 64:
                continue  # the gated epilogue holds both halves: K tiles of 64 at these rows
            filling = max(1, min(sms // triton.cdiv(n, tiles.block_n), k // (4 * tiles.block_k)))
            for splits in sorted({1, filling}) if not gated else [1]:  # the epilogue needs whole sums
                out, launch = _skinny_launch(x, weights[0], tiles, splits, gated)
                launch(weights[0])
                got = out.float().sum(0) if out.dim() == 3 else out.float()
                error = ((got - expected).abs().max() / expected.abs().max()).item()
                us = graph_us_per_call(launch, weights)
                partial_bytes = 2 * out.numel() * 4 if out.dim() == 3 else 0
                l2_bytes = n * k * 2 * (1 + m / tiles.block_n) + partial_bytes
                launch_row = {**tiles._asdict(), "splits": len(out) if out.dim() == 3 else 1, "us": us}
                entry["launches"].append({**launch_row, "l2_bytes": l2_bytes, "max_rel_error": error})
                print(
                    f"{name:8s} m={m:3d} {tiles} splits={launch_row['splits']:2d}: {us:6.1f} us "
                    f"(cuBLAS {entry['cublas_us']:6.1f}), L2 {l2_bytes / us / 1e6:5.2f} TB/s, "
                    f"weights {n * k * 2 / us / 1e6:5.2f} TB/s, max relative error {error:.1e}",
                    flush=True,
                )
        print(f"{name:8s} m={m:3d} cuBLAS: {entry['cublas_us']:6.1f} us, {entry['cublas_kernel']}", flush=True)
        rows.append(entry)
        del weights
    return [bandwidth, *rows]


def balance_rows(batches: list[int], bandwidth: float) -> list[dict]:
    """The skinny kernel's weight bandwidth against its programs per SM, beside cuBLAS at the same shape (the plain
    product, without gate/up's silu_mul): gate/up (gated, whole K) in 64-, 128- and 256-row weight tiles, its
    weight rows scaled so that a launch holds exactly 1-3 programs an SM, and at its real size; down_proj (split-K
    partials) at its own K. The balanced launches bound what any tiling could stream at these rows."""
    rows, sms = [], torch.cuda.get_device_properties(0).multi_processor_count
    wide = [Tiles(64, 64, 4, 4), Tiles(128, 64, 4, 3), Tiles(128, 64, 8, 3), Tiles(256, 64, 8, 3)]
    launches = [
        ("gate_up", n, 2560, tiles, 1, True)
        for tiles in wide
        for n in [tiles.block_n * sms * p for p in (1, 2, 3)] + [19456]
    ]
    launches += [("gate_up", 2 * 32 * 4 * sms, 2560, Tiles(64, 64, 4, 4), 1, True)]
    launches += [("gate_up", 19456, 2560, Tiles(64, 64, 4, 3), 1, True)]
    launches += [("down", n, 9728, Tiles(64, 128), splits, False) for n, splits in ((2560, 3), (2560, 6))]
    launches += [("down", 64 * sms // 3, 9728, Tiles(64, 128), 3, False)]
    for m, (name, n, k, tiles, splits, gated) in itertools.product(batches, launches):
        weights = _weights(n, k)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out, launch = _skinny_launch(x, weights[0], tiles, splits, gated)
        us = graph_us_per_call(launch, weights)
        cublas_us = graph_us_per_call(lambda w: torch.mm(x, w.t()), weights)
        slices = out.shape[0] if out.dim() == 3 else 1  # the split count once no slice of K is empty
        programs = triton.cdiv(out.shape[-1], tiles.block_n // 2 if gated else tiles.block_n) * slices
        row = {"shape": name, "m": m, "n": n, "k": k, **tiles._asdict(), "splits": slices, "programs": programs,
               "us": us, "of_bandwidth": n * k * 2 / (us * 1e-6) / bandwidth, "cublas_us": cublas_us,
               "cublas_of_bandwidth": n * k * 2 / (cublas_us * 1e-6) / bandwidth}  # fmt: skip
        rows.append(row)
        print(
            f"{name:8s} m={m:3d} n={n:6d} {tiles} splits={slices}: {programs:4d} programs "
            f"({programs / sms:4.2f} an SM) {us:6.1f} us, weights at {100 * row['of_bandwidth']:4.1f}% of the "
            f"bandwidth; cuBLAS {cublas_us:6.1f} us, {100 * row['cublas_of_bandwidth']:4.1f}%",
            flush=True,
        )
        del weights
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["gemm", "attention"],
        choices=["gemm", "attention", "invariant", "sampling", "tiles", "balance"],
    )
    parser.add_argument("--invariant-rows", type=int, nargs="+", default=[16, 64, 256, 1024, 2048])
    parser.add_argument("--sampling-rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--tile-rows", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    bandwidths = stream_bandwidths()
    bandwidth = bandwidths["bandwidth_bytes_s"]
    result = {**bandwidths, **environment()}
    if "gemm" in args.parts:
        result["gemm"] = gemm_rows(args.batch, bandwidth)
    if "attention" in args.parts:
        result["attention"] = attention_rows(bandwidth)
    if "invariant" in args.parts:
        result["invariant"] = invariant_rows(args.invariant_rows)
    if "sampling" in args.parts:
        result["sampling"] = sampling_rows(args.sampling_rows)
    if "tiles" in args.parts:
        result["tiles"] = tile_rows(args.tile_rows)
    if "balance" in args.parts:
        result["balance"] = balance_rows(args.tile_rows, bandwidth)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
