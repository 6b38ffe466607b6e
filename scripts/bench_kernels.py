"""Per-kernel decisions for the decode step, measured on the GPU (CUDA-graph replay medians, µs):
the Qwen3-4B projections through cuBLAS against ops/linear.py's skinny GEMM, the paged decode
attention's tile size and split count, what engine.batch_invariant's GEMM costs against cuBLAS, and the
sampler's passes over a step's [B, 151936] logits (each against greedy's argmax, the pass every step has).

Usage: python -m scripts.bench_kernels --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from qwen3_runtime.ops import decode_attention
from qwen3_runtime.ops.greedy import greedy_max
from qwen3_runtime.ops.invariant_linear import invariant_linear
from qwen3_runtime.ops.linear import linear, linear_partials
from qwen3_runtime.ops.penalties import SlotState, apply_penalties
from qwen3_runtime.params import MAX_LOGIT_BIAS
from qwen3_runtime.runner import TOP_K_CAP
from qwen3_runtime.sampler import SamplingTensors, filter_cutoffs, sample_raw, sample_selected
from scripts.report import environment
from scripts.timing import copy_bandwidth, graph_us_per_call

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
        penalty_rows = (
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
            "penalties_copy": lambda x: apply_penalties(x, *penalty_rows, slots),
            "penalties_biased": lambda x: apply_penalties(x, *penalty_rows, biased),  # 32 logit_bias entries a row
        }
        row = {"batch": batch, **{name: graph_us_per_call(step, logits) for name, step in parts.items()}}
        rows.append(row)
        print(
            f"sampling B={batch:3d}: "
            + "  ".join(f"{name} {us:7.1f} us" for name, us in row.items() if name != "batch"),
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument(
        "--parts", nargs="+", default=["gemm", "attention"], choices=["gemm", "attention", "invariant", "sampling"]
    )
    parser.add_argument("--invariant-rows", type=int, nargs="+", default=[16, 64, 256, 1024, 2048])
    parser.add_argument("--sampling-rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    result = {"copy_bandwidth_bytes_s": bandwidth, **environment()}
    if "gemm" in args.parts:
        result["gemm"] = gemm_rows(args.batch, bandwidth)
    if "attention" in args.parts:
        result["attention"] = attention_rows(bandwidth)
    if "invariant" in args.parts:
        result["invariant"] = invariant_rows(args.invariant_rows)
    if "sampling" in args.parts:
        result["sampling"] = sampling_rows(args.sampling_rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
