"""Tunes the expert kernels' tiles (ops/fused_moe_kernels.py) on this GPU and writes them where ops/moe_config.py
looks: for each MoE shape and token count, candidate configurations of gate/up and of down are timed apart (CUDA-graph
replay medians over random routings, uniform over the experts, each routing's experts new to L2), and the fastest of
each goes into that kernel's JSON file. A sorted candidate's time includes its grouping (torch.sort and the block
table), which a call whose two kernels share a block_m pays once.

Each candidate's output is checked against the default configuration's on the first routing, so a tile that
miscompiles is never chosen. The candidates are few (tile shapes that suit the expert rows per token count) and
compile once for every shape: both default shapes take a few minutes on an H100.

Usage: python -m scripts.tune_moe [--shapes E,H,I,K ...] [--tokens 1 2 4 ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton

from qwen3_runtime.ops import fused_moe as moe
from qwen3_runtime.ops.moe_config import CONFIG_DIR, MoeConfig, config_file_name, default_config, device_name
from scripts.timing import graph_us_per_call

# (experts, hidden, moe_intermediate, top_k): Qwen3-30B-A3B, Qwen3-235B-A22B.
SHAPES = [(128, 2048, 768, 8), (128, 4096, 1536, 8)]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
SCAN_MAX_PAIRS = 1024  # scan candidates up to this many pairs, sorted ones from SORTED_MIN_TOKENS tokens
SORTED_MIN_TOKENS = 32
SCAN_K_STAGES = [(128, 4), (256, 3), (256, 4)]  # long K-tiles, enough of them in flight to stream the weights
SORTED_TILES = [  # (block_m, block_n, block_k, num_warps, num_stages)
    (16, 64, 128, 4, 4),
    (32, 64, 128, 4, 4),
    (32, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 3),
    (64, 128, 64, 4, 4),
    (64, 256, 64, 8, 3),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
]
SMEM_BYTES = 200 * 1024  # what a program's pipeline buffers may take (Hopper: 227 KB an SM)


def candidates(tokens: int, num_experts: int, top_k: int, n: int) -> list[MoeConfig]:
    """Scan tiles of 16 rows (32 once an expert averages 4 rows) over narrow to wide column tiles and long K-tiles;
    sorted tiles whose block_m is between half and four times the rows an expert averages (64 suffices for any)."""
    pairs = tokens * top_k
    per_expert = triton.next_power_of_2(triton.cdiv(pairs, num_experts))
    found = []
    if pairs <= SCAN_MAX_PAIRS:
        for block_m, block_n, (block_k, stages) in itertools.product((16, 32), (32, 64, 128), SCAN_K_STAGES):
            if block_m == 16 or per_expert >= 4:
                found.append(MoeConfig(False, block_m, block_n, block_k, 4, stages))
    if tokens >= SORTED_MIN_TOKENS:
        for block_m, block_n, block_k, warps, stages in SORTED_TILES:
            if min(64, per_expert // 2) <= block_m <= max(16, 4 * per_expert):
                found.append(MoeConfig(True, block_m, block_n, block_k, warps, stages, group_m=8))
    return [
        c
        for c in found
        if c.block_n <= max(32, triton.next_power_of_2(n))
        and (c.num_stages - 1) * (c.block_m + c.block_n) * c.block_k * 2 <= SMEM_BYTES
    ]


def routings(tokens: int, num_experts: int, top_k: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random routings: k distinct experts a token, uniform; weights summing to 1."""
    found = []
    for _ in range(count):
        ids = torch.rand(tokens, num_experts, device="cuda").topk(top_k, dim=1).indices.int()
        found.append((ids, torch.rand(tokens, top_k, device="cuda").softmax(dim=1)))
    return found


def tune_shape(num_experts: int, hidden: int, inter: int, top_k: int, token_counts: list[int], out_dir: Path) -> None:
    w13 = torch.randn(num_experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) * hidden**-0.5
    w2 = torch.randn(num_experts, hidden, inter, device="cuda", dtype=torch.bfloat16) * inter**-0.5
    expert_bytes = {"gate_up": w13[0].numel() * 2, "down": w2[0].numel() * 2}
    dev = device_name(torch.device("cuda"))
    paths = {k: out_dir / config_file_name(*w.shape, top_k, w.dtype, dev) for k, w in (("gate_up", w13), ("down", w2))}
    # Counts tuned before and not asked for now stay (a run for prefill counts keeps the decode ones).
    tuned = {k: json.loads(path.read_text()) if path.is_file() else {} for k, path in paths.items()}
    for tokens in token_counts:
        # Enough routings that one graph replay reads more weights than L2 holds, fewer for the long products.
        routes = routings(tokens, num_experts, top_k, 8 if tokens <= 256 else 2)
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        act = torch.randn(tokens * top_k, inter, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(top_k, tokens, hidden, device="cuda")
        distinct = sum(len(ids.unique()) for ids, _ in routes) / len(routes)
        steps = {
            "gate_up": lambda c, r: moe.gate_up(x, w13, r[0], act, c, {}),
            "down": lambda c, r: moe.down(act, w2, r[0], r[1], out, c, {}),
        }
        outputs = {"gate_up": act, "down": out}
        for kernel, step in steps.items():
            n = w13.shape[1] if kernel == "gate_up" else hidden
            default = default_config(tokens, top_k)
            step(default, routes[0])
            expected = outputs[kernel].clone()
            times = {}
            for config in dict.fromkeys([default, *candidates(tokens, num_experts, top_k, n)]):
                outputs[kernel].fill_(float("nan"))  # an element the candidate leaves unwritten fails the check
                step(config, routes[0])
                if not torch.allclose(outputs[kernel].float(), expected.float(), rtol=0.02, atol=0.02):
                    print(f"  skipped (wrong output): {config}")
                    continue
                times[config] = graph_us_per_call(lambda r: step(config, r), routes, replays=5 if tokens > 256 else 15)
            best = min(times, key=times.get)
            tuned[kernel][str(tokens)] = best._asdict()
            gbs = distinct * expert_bytes[kernel] / (times[best] * 1e-6) / 1e9
            print(
                f"E={num_experts} H={hidden} I={inter} {kernel:7s} T={tokens:5d}: {times[best]:8.1f} us "
                f"(default {times[default]:8.1f}), {distinct:5.1f} experts at {gbs:6.0f} GB/s  {best}",
                flush=True,
            )
        # Written after each token count: a run stopped early keeps the counts it tuned (the lookup takes the
        # nearest count at or above a call's, else the largest).
        for kernel, path in paths.items():
            entries = sorted(tuned[kernel].items(), key=lambda entry: int(entry[0]))
            path.write_text(json.dumps(dict(entries), indent=1) + "\n")
    print(f"wrote {out_dir}: {', '.join(tuned['down'])} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes", nargs="+", default=[",".join(map(str, s)) for s in SHAPES], help="experts,hidden,inter,top_k"
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    parser.add_argument("--out", type=Path, default=CONFIG_DIR)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for shape in args.shapes:
        tune_shape(*map(int, shape.split(",")), sorted(args.tokens), args.out)


if __name__ == "__main__":
    main()
