"""Block-FP8 kernels against bf16 on the GPU (CUDA-graph replay medians, µs), for issue 72's decisions:

- `proj`: Qwen3-4B's projections as the model calls them (qkv: linear; o_proj, down_proj: split-K partials; gate/up:
  silu * up fused) at each row count, bf16 (ops.linear) against FP8 (ops.fp8_linear), with the FP8 read floor (weights,
  scales, x and the output once at the measured read bandwidth), GB/s and TFLOP/s. Beside them each FP8 path forced:
  weight-only in the skinny kernel (rows it can take), W8A8 (activation quantization + block-scaled GEMM), the GEMM
  alone, and torch._scaled_mm with 1x128 / 128x128 block scales where this torch and GPU take it (the GEMM alone, plain
  product: no silu * up; its error against the W8A8 GEMM recorded): where the paths cross sets FP8_SKINNY_MAX_ROWS / FP8_FUSED_MAX_ROWS and whether _scaled_mm should serve
  prefills.
- `moe`: Qwen3-30B-A3B's experts (E 128, H 2048, I 768, k 8), ops.fused_moe bf16 against FP8 at decode token counts,
  with the floor of the experts the routing reaches (a fresh random routing per call, so L2 holds none).
- `tiles` (not by default): the W8A8 GEMM's tile shapes at the large row counts.

Weights are cycled per graph (400 MB of copies) so L2 never holds them. On a machine without a GPU it prints that and
exits 0.

Usage: python -m scripts.bench_fp8 --out DIR [--rows 1 8 32 128 512 4096] [--parts proj moe tiles]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from qwen3_runtime.ops.fp8_linear import (
    FP8_FUSED_MAX_ROWS,
    W8A8Tiles,
    fp8_gated_linear,
    fp8_linear,
    fp8_linear_partials,
    quantize_activation_groups,
    quantize_blocks,
    w8a8_linear,
    w8a8_matmul,
)
from qwen3_runtime.ops.fused_moe import fused_moe
from qwen3_runtime.ops.linear import (
    gated_linear,
    linear,
    linear_partials,
    skinny_gated_linear,
    skinny_linear,
    skinny_partials,
)
from scripts.report import environment
from scripts.timing import graph_us_per_call, stream_bandwidths, synchronize

# Qwen3-4B: (name, weight rows, in features); gate/up's weight holds gate and up rows.
SHAPES = [("qkv", 6144, 2560), ("o_proj", 2560, 4096), ("gate_up", 19456, 2560), ("down", 2560, 9728)]
ROWS = [1, 8, 32, 128, 512, 4096]
MOE = dict(num_experts=128, hidden=2048, inter=768, top_k=8)
MOE_TOKENS = [1, 8, 32, 64]
ROTATE_BYTES = 400 << 20
DEVICE, DTYPE = "cuda", torch.bfloat16  # the CPU smoke test (tests/scripts/test_bench_fp8.py) runs fp32 on the CPU
TILE_SWEEP = [
    W8A8Tiles(64, 128, num_warps=4, num_stages=3),
    W8A8Tiles(64, 128, num_warps=4, num_stages=4),
    W8A8Tiles(64, 256, num_warps=8, num_stages=3),
    W8A8Tiles(128, 128, num_warps=8, num_stages=3),
    W8A8Tiles(128, 128, num_warps=8, num_stages=4),
    W8A8Tiles(128, 256, num_warps=8, num_stages=3),
    W8A8Tiles(128, 128, 64, num_warps=8, num_stages=4),
]


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# torch._scaled_mm's scale layouts to try, as (activation scales [M, K / 128], weight scales [N / 128, K / 128]) ->
# (scale_a, scale_b) for a [M, K] @ w^T [K, N]: cuBLAS asks the activation scales M-major.
SCALED_MM_LAYOUTS = [
    lambda xs, s: (xs.t().contiguous().t(), s.t()),
    lambda xs, s: (xs, s.t()),
    lambda xs, s: (xs.t().contiguous().t(), s.t().contiguous()),
]


def _scaled_mm(xq: torch.Tensor, xs: torch.Tensor, q: torch.Tensor, s: torch.Tensor, want: torch.Tensor):
    """torch._scaled_mm over 1x128 activation and 128x128 weight blocks (the quantized activations given) as a
    step over (q, s), and its largest error relative to `want`'s largest value; or None and why it refuses."""
    errors = []
    for layout in SCALED_MM_LAYOUTS:

        def call(qs, layout=layout):
            scale_a, scale_b = layout(xs, qs[1])
            return torch._scaled_mm(xq, qs[0].t(), scale_a=scale_a, scale_b=scale_b, out_dtype=DTYPE)

        try:
            got = call((q, s)).float()
            synchronize(DEVICE)
        except (RuntimeError, ValueError, TypeError) as error:
            errors.append(str(error).strip().splitlines()[0][:200])
            continue
        return call, ((got - want.float()).abs().max() / want.float().abs().max()).item()
    return None, errors[0]


def projection_rows(rows_list: list[int], bandwidth: float) -> list[dict]:
    results = []
    for name, n, k in SHAPES:
        gated, partials = name == "gate_up", name in ("o_proj", "down")
        bf16 = [(torch.randn(n, k, device=DEVICE) * 0.02).to(DTYPE) for _ in range(max(2, ROTATE_BYTES // (2 * n * k)))]
        fp8 = [quantize_blocks(torch.randn(n, k, device=DEVICE) * 0.02) for _ in range(max(2, ROTATE_BYTES // (n * k)))]
        for rows in rows_list:
            x = torch.randn(rows, k, device=DEVICE).to(DTYPE)
            if gated:
                ours, theirs, forced = gated_linear, fp8_gated_linear, skinny_gated_linear
            elif partials:
                ours, theirs, forced = linear_partials, fp8_linear_partials, skinny_partials
            else:
                ours, theirs, forced = linear, fp8_linear, skinny_linear
            out = theirs(x, *fp8[0])
            fp8_bytes = _bytes(*fp8[0], x, out)
            row = {
                "shape": name,
                "n": n,
                "k": k,
                "rows": rows,
                "bf16_bytes": _bytes(bf16[0], x, ours(x, bf16[0])),
                "fp8_bytes": fp8_bytes,
                "fp8_floor_us": fp8_bytes / bandwidth * 1e6,
                "bf16_us": graph_us_per_call(lambda w: ours(x, w), bf16),
                "fp8_us": graph_us_per_call(lambda qs: theirs(x, *qs), fp8),
            }
            if rows <= FP8_FUSED_MAX_ROWS:
                row["weight_only_us"] = graph_us_per_call(lambda qs: forced(x, qs[0], scale=qs[1]), fp8)
            row["w8a8_us"] = graph_us_per_call(lambda qs: w8a8_linear(x, *qs, gated=gated), fp8)
            xq, xs = quantize_activation_groups(x)
            row["w8a8_gemm_us"] = graph_us_per_call(lambda qs: w8a8_matmul(xq, xs, *qs, DTYPE, gated), fp8)
            row["quantize_us"] = graph_us_per_call(lambda t: quantize_activation_groups(t), [x])
            want = w8a8_matmul(xq, xs, *fp8[0], DTYPE)
            call, error = _scaled_mm(xq, xs, *fp8[0], want)
            if call is not None:
                row["scaled_mm_us"] = graph_us_per_call(call, fp8)
                row["scaled_mm_rel_err"] = error  # against the W8A8 GEMM's plain product
            else:
                row["scaled_mm_error"] = error
            row["speedup"] = row["bf16_us"] / row["fp8_us"]
            row["fp8_of_floor"] = row["fp8_floor_us"] / row["fp8_us"]
            row["fp8_gb_s"] = fp8_bytes / row["fp8_us"] / 1e3
            row["fp8_tflops"] = 2 * rows * n * k / row["fp8_us"] / 1e6
            row["bf16_tflops"] = 2 * rows * n * k / row["bf16_us"] / 1e6
            results.append(row)
            _print_projection(row)
        del bf16, fp8
        torch.cuda.empty_cache()
    return results


def _print_projection(row: dict) -> None:
    def us(key: str) -> str:
        return f"{row[key]:8.1f}" if key in row else "       -"

    print(
        f"{row['shape']:8s} {row['rows']:5d} | bf16 {row['bf16_us']:8.1f} | fp8 {row['fp8_us']:8.1f} "
        f"x{row['speedup']:4.2f} | floor {row['fp8_floor_us']:7.1f} ({100 * row['fp8_of_floor']:3.0f}%) "
        f"{row['fp8_gb_s']:5.0f} GB/s {row['fp8_tflops']:6.1f} TF/s (bf16 {row['bf16_tflops']:6.1f}) | "
        f"w-only {us('weight_only_us')} w8a8 {us('w8a8_us')} (gemm {us('w8a8_gemm_us')}, quant {us('quantize_us')}) "
        f"scaled_mm {us('scaled_mm_us')}",
        flush=True,
    )


def moe_rows(tokens_list: list[int], bandwidth: float) -> list[dict]:
    e, h, i, top_k = MOE["num_experts"], MOE["hidden"], MOE["inter"], MOE["top_k"]
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    w13 = (torch.randn(e, 2 * i, h, device=DEVICE, generator=gen) * h**-0.5).to(DTYPE)
    w2 = (torch.randn(e, h, i, device=DEVICE, generator=gen) * i**-0.5).to(DTYPE)
    (q13, s13), (q2, s2) = quantize_blocks(w13), quantize_blocks(w2)
    results = []
    for tokens in tokens_list:
        x = torch.randn(tokens, h, device=DEVICE, generator=gen).to(DTYPE)
        routings = []
        for _ in range(16):  # a fresh routing per call in the graph
            ids = torch.stack([torch.randperm(e, device=DEVICE, generator=gen)[:top_k] for _ in range(tokens)])
            routings.append((ids.int(), torch.rand(tokens, top_k, device=DEVICE, generator=gen)))
        experts = sum(len(ids.unique()) for ids, _ in routings) / len(routings)
        fp8_bytes = experts * (_bytes(q13[0], q2[0], s13[0], s2[0])) + _bytes(x) + 4 * top_k * tokens * h
        row = {
            "tokens": tokens,
            "experts_read": experts,
            "fp8_bytes": fp8_bytes,
            "fp8_floor_us": fp8_bytes / bandwidth * 1e6,
            "bf16_us": graph_us_per_call(lambda r: fused_moe(x, w13, w2, *r), routings),
            "fp8_us": graph_us_per_call(lambda r: fused_moe(x, q13, q2, *r, w13_scale=s13, w2_scale=s2), routings),
        }
        row["speedup"] = row["bf16_us"] / row["fp8_us"]
        row["fp8_of_floor"] = row["fp8_floor_us"] / row["fp8_us"]
        results.append(row)
        print(
            f"moe T={tokens:3d} ({experts:5.1f} experts) | bf16 {row['bf16_us']:8.1f} | fp8 {row['fp8_us']:8.1f} "
            f"x{row['speedup']:4.2f} | floor {row['fp8_floor_us']:7.1f} ({100 * row['fp8_of_floor']:3.0f}%)",
            flush=True,
        )
    return results


def tile_rows(rows_list: list[int]) -> list[dict]:
    """The W8A8 GEMM alone (quantized activations given) over TILE_SWEEP, at each projection and row count."""
    results = []
    for (name, n, k), rows in ((shape, rows) for shape in SHAPES for rows in rows_list if rows > FP8_FUSED_MAX_ROWS):
        fp8 = [quantize_blocks(torch.randn(n, k, device=DEVICE) * 0.02) for _ in range(max(2, ROTATE_BYTES // (n * k)))]
        xq, xs = quantize_activation_groups(torch.randn(rows, k, device=DEVICE).to(DTYPE))
        for tiles in TILE_SWEEP:
            gated = name == "gate_up"
            us = graph_us_per_call(lambda qs: w8a8_matmul(xq, xs, *qs, DTYPE, gated, tiles), fp8)
            results.append({"shape": name, "rows": rows, "tiles": tiles._asdict(), "us": us})
            print(f"tiles {name:8s} {rows:5d} {tuple(tiles)}: {us:8.1f} us {2 * rows * n * k / us / 1e6:6.1f} TF/s")
        del fp8
    return results


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=ROWS)
    parser.add_argument("--moe-tokens", type=int, nargs="+", default=MOE_TOKENS)
    parser.add_argument("--parts", nargs="+", default=["proj", "moe"], choices=["proj", "moe", "tiles"])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fp8: no CUDA GPU here, nothing measured (the FP8 kernels' timings need one)")
        return None
    bandwidths = stream_bandwidths()
    result = {**bandwidths, **environment(), "capability": list(torch.cuda.get_device_capability())}
    print(f"{result['gpu']}: read bandwidth {bandwidths['bandwidth_bytes_s'] / 1e9:.0f} GB/s", flush=True)
    if "proj" in args.parts:
        result["projections"] = projection_rows(args.rows, bandwidths["bandwidth_bytes_s"])
    if "moe" in args.parts:
        result["moe"] = moe_rows(args.moe_tokens, bandwidths["bandwidth_bytes_s"])
    if "tiles" in args.parts:
        result["tiles"] = tile_rows(args.rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
