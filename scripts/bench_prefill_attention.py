"""Paged prefill attention (ops/prefill_attention.py) on the GPU at Qwen3-4B's attention shape (32 query
heads over 8 KV heads, head_dim 128, bf16, block 16, shuffled blocks): median µs (triton.testing.do_bench)
against the causal FLOPs floor at the bf16 matmul rate measured in the same run (a large cuBLAS GEMM), and
against PyTorch's flash SDPA on contiguous K/V of the same shapes (bottom-right causal, native GQA). Each
tile configuration in --configs is timed; the first is the module's default. Shapes of one whole prompt also
time `attend_prefill`, which sends them to cuDNN, and its first call at a new length (cuDNN builds a plan per
shape).

Usage: python -m scripts.bench_prefill_attention --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton

from qwen3_runtime.ops import prefill_attention
from qwen3_runtime.ops.prefill_attention import PrefillPlan, attend_prefill, paged_prefill_attention
from scripts.report import environment
from scripts.timing import matmul_rate, synchronize

HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 128, 16
# (name, [(cached prefix, new tokens)] per sequence)
SHAPES = [
    ("1x4096", [(0, 4096)]),
    ("8x1024", [(0, 1024)] * 8),
    ("1x8000", [(0, 8000)]),
    ("1x8001", [(0, 8001)]),
    ("1x512 after 3584", [(3584, 512)]),
]
DEFAULT = (
    prefill_attention.BLOCK_M,
    prefill_attention.BLOCK_N,
    prefill_attention.NUM_WARPS,
    prefill_attention.NUM_STAGES,
)
# (BLOCK_M, BLOCK_N, num_warps, num_stages) beside the default
ALTERNATIVES = [(128, 64, 8, 3), (128, 128, 8, 2), (64, 32, 4, 3)]


def causal_flops(seqs: list[tuple[int, int]]) -> int:
    """Two matmuls (QK^T, PV) of 2 * D FLOPs per (query head, query, key attended)."""
    keys = sum(n * prefix + n * (n + 1) // 2 for prefix, n in seqs)
    return 2 * 2 * HEADS * DIM * keys


def shape_inputs(seqs: list[tuple[int, int]], generator: torch.Generator):
    """q [T, H, D] of the new tokens; the contiguous K/V [B, S, KVH, D] (all sequences one length) and the
    same K/V in a paged cache of shuffled blocks."""
    seq_len = seqs[0][0] + seqs[0][1]
    batch, blocks_per_seq = len(seqs), -(-seq_len // BLOCK)
    k, v = (torch.randn(batch, seq_len, KV_HEADS, DIM, generator=generator).bfloat16().cuda() for _ in range(2))
    q = torch.randn(sum(n for _, n in seqs), HEADS, DIM, generator=generator).bfloat16().cuda()
    tables = torch.randperm(batch * blocks_per_seq, generator=generator).view(batch, blocks_per_seq)
    positions = torch.arange(seq_len)
    slots = (tables[:, positions // BLOCK] * BLOCK + positions % BLOCK).cuda()  # [B, S]
    caches = []
    for dense in (k, v):
        cache = torch.empty(batch * blocks_per_seq * BLOCK, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
        cache[slots.flatten()] = dense.flatten(0, 1)
        caches.append(cache.view(-1, BLOCK, KV_HEADS, DIM))
    return q, k, v, caches, tables.tolist()


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: list[tuple[int, int]]) -> torch.Tensor:
    """FlashAttention-2 through PyTorch: causal aligned bottom-right (queries are the last new tokens), GQA
    native. q [T, H, D] -> [B, H, L, D]; k/v [B, S, KVH, D] -> [B, KVH, S, D] (views)."""
    batch, query_len = len(seqs), seqs[0][1]
    qb = q.view(batch, query_len, HEADS, DIM).transpose(1, 2)
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        qb, k.transpose(1, 2), v.transpose(1, 2), 0.0, is_causal=True, scale=DIM**-0.5
    )[0]
    return out.transpose(1, 2).reshape(q.shape)


def bench_shape(name: str, seqs: list[tuple[int, int]], configs: list[tuple[int, int, int, int]], rate: float) -> dict:
    generator = torch.Generator().manual_seed(0)
    q, k, v, (k_cache, v_cache), tables = shape_inputs(seqs, generator)
    query_lens, seq_lens = [n for _, n in seqs], [p + n for p, n in seqs]
    floor_us = causal_flops(seqs) / rate * 1e6
    flash_out = sdpa_flash(q, k, v, seqs)
    flash_us = triton.testing.do_bench(lambda: sdpa_flash(q, k, v, seqs), return_mode="median") * 1e3
    row = {"shape": name, "seqs": seqs, "flops": causal_flops(seqs), "floor_us": floor_us, "sdpa_flash_us": flash_us}
    print(
        f"{name:18s} floor {floor_us:8.1f} us   SDPA flash {flash_us:8.1f} us ({floor_us / flash_us:.0%})", flush=True
    )
    if len(seqs) == 1 and seqs[0][0] == 0:  # one whole prompt: attend_prefill's cuDNN path
        plan = PrefillPlan.build(query_lens, seq_lens, tables, q.device, group_size=HEADS // KV_HEADS)
        k_new, v_new = k[0], v[0]
        run = lambda: attend_prefill(q, k_new, v_new, k_cache, v_cache, plan, DIM**-0.5)
        synchronize(q.device)
        start = time.perf_counter()
        out = run()
        synchronize(q.device)
        row["cudnn_first_call_us"] = (time.perf_counter() - start) * 1e6
        row["cudnn_us"] = triton.testing.do_bench(run, return_mode="median") * 1e3
        row["cudnn_rel_err_vs_sdpa"] = ((out.float() - flash_out.float()).norm() / flash_out.float().norm()).item()
        print(
            f"{'':18s} attend_prefill (cuDNN): {row['cudnn_us']:8.1f} us ({floor_us / row['cudnn_us']:.0%} of floor; "
            f"first call {row['cudnn_first_call_us']:.0f} us; rel err {row['cudnn_rel_err_vs_sdpa']:.1e})",
            flush=True,
        )
    row["configs"] = []
    for block_m, block_n, warps, stages in configs:
        prefill_attention.BLOCK_N, prefill_attention.NUM_WARPS, prefill_attention.NUM_STAGES = block_n, warps, stages
        build = lambda: PrefillPlan.build(
            query_lens, seq_lens, tables, q.device, group_size=HEADS // KV_HEADS, block_m=block_m
        )
        plan = build()
        start = time.perf_counter()
        for _ in range(20):
            build()
        build_us = (time.perf_counter() - start) / 20 * 1e6
        out = paged_prefill_attention(q, k_cache, v_cache, plan, DIM**-0.5)
        rel_err = ((out.float() - flash_out.float()).norm() / flash_out.float().norm()).item()
        us = (
            triton.testing.do_bench(
                lambda: paged_prefill_attention(q, k_cache, v_cache, plan, DIM**-0.5), return_mode="median"
            )
            * 1e3
        )
        row["configs"].append(
            {
                "block_m": block_m,
                "block_n": block_n,
                "num_warps": warps,
                "num_stages": stages,
                "us": us,
                "plan_build_us": build_us,
                "rel_err_vs_sdpa": rel_err,
                "tflops": causal_flops(seqs) / us * 1e-6,
            }
        )
        print(
            f"{'':18s} BLOCK_M={block_m:3d} BLOCK_N={block_n:3d} warps={warps} stages={stages}: {us:8.1f} us "
            f"({floor_us / us:.0%} of floor, {flash_us / us:.2f}x SDPA flash; plan {build_us:.0f} us host, "
            f"rel err {rel_err:.1e})",
            flush=True,
        )
    prefill_attention.BLOCK_N, prefill_attention.NUM_WARPS, prefill_attention.NUM_STAGES = DEFAULT[1:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--configs",
        nargs="*",
        default=[",".join(map(str, c)) for c in [DEFAULT, *ALTERNATIVES]],
        help="BLOCK_M,BLOCK_N,num_warps,num_stages each (the first is the default)",
    )
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs]
    rate = matmul_rate()
    print(f"bf16 GEMM rate {rate / 1e12:.0f} TFLOP/s", flush=True)
    result = {"matmul_flops_s": rate, "shapes": [bench_shape(name, seqs, configs, rate) for name, seqs in SHAPES]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_attention.json").write_text(json.dumps({**result, **environment()}, indent=2))


if __name__ == "__main__":
    main()
