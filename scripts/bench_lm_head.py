"""What fp32 logits cost: the lm_head written in fp32 (bf16 operands, fp32 accumulation) against the
bf16 product, Qwen3-4B shape, per decode step.

Usage: python -m scripts.bench_lm_head --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from scripts.report import environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=2560)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    weight = torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    rows = []
    for batch in args.batch:
        hidden = torch.randn(batch, args.hidden, device="cuda", dtype=torch.bfloat16)
        fp32_out = do_bench(lambda: torch.mm(hidden, weight.t(), out_dtype=torch.float32), return_mode="median")
        bf16_out = do_bench(lambda: F.linear(hidden, weight), return_mode="median")
        bf16_then_float = do_bench(lambda: F.linear(hidden, weight).float(), return_mode="median")
        exact = hidden.double() @ weight.double().t()
        err = lambda x: ((x.double() - exact).abs().max() / exact.abs().max()).item()
        row = {
            "batch": batch,
            "fp32_out_us": 1e3 * fp32_out,
            "bf16_out_us": 1e3 * bf16_out,
            "bf16_then_float_us": 1e3 * bf16_then_float,
            "fp32_out_rel_err": err(torch.mm(hidden, weight.t(), out_dtype=torch.float32)),
            "bf16_out_rel_err": err(F.linear(hidden, weight)),
        }
        rows.append(row)
        print(
            f"lm_head batch {batch:3d}: fp32 out {row['fp32_out_us']:.1f} us, bf16 out {row['bf16_out_us']:.1f} us, "
            f"bf16 + .float() {row['bf16_then_float_us']:.1f} us; max rel err {row['fp32_out_rel_err']:.1e} vs "
            f"{row['bf16_out_rel_err']:.1e}",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lm_head.json").write_text(json.dumps({"rows": rows, **environment()}, indent=2))


if __name__ == "__main__":
    main()
