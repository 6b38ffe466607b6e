"""bf16 parity with transformers on the GPU: a random checkpoint of a real Qwen3 (or Qwen3-MoE) shape, written by
transformers, loaded by both; logits of a prefill and of a paged decode step compared.

Usage: python -m scripts.gpu_parity --config qwen3-0.6b --out DIR
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from qwen3_runtime.config import ModelConfig, load_config
from qwen3_runtime.kv_cache import allocate_kv_cache
from qwen3_runtime.layers.attention import AttentionMetadata
from qwen3_runtime.loader import load_model
from qwen3_runtime.ops.prefill_attention import PrefillPlan
from scripts.hf_reference import random_hf_model
from scripts.report import environment


def write_checkpoint(config_name: str, path: Path, layers: int | None) -> None:
    arch = load_config(config_name).model.architecture
    random_hf_model(arch, layers).save_pretrained(path)


def compare(path: Path, prompt_len: int) -> dict:
    import transformers

    device = torch.device("cuda")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    ours = load_model(ModelConfig(path=str(path)), device, torch.bfloat16)
    ours.build_rope_table(4096)
    ids = torch.randint(0, ours.config.vocab_size, (prompt_len,), device=device)
    block, n = 16, prompt_len
    kv = allocate_kv_cache(ours.config, n // block + 2, block, torch.bfloat16, device)
    table = torch.randperm(n // block + 2, device=device)[: (n + block - 1) // block]
    pos = torch.arange(n, device=device)
    slots = table[pos // block] * block + pos % block
    with torch.no_grad():
        ref = theirs(ids[None]).logits[0].float()
        group_size = ours.config.num_attention_heads // ours.config.num_key_value_heads
        plan = PrefillPlan.build([n - 1], [n - 1], [table.tolist()], device, group_size=group_size)
        meta = AttentionMetadata(slot_mapping=slots[:-1], prefill=plan)
        prefill = ours.compute_logits(ours(ids[:-1], pos[:-1], kv, meta))
        meta = AttentionMetadata(
            slot_mapping=slots[-1:],
            block_tables=table[None].int(),
            seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
            num_splits=4,
        )
        decode = ours.compute_logits(ours(ids[-1:], pos[-1:], kv, meta))
    ours_all = torch.cat([prefill, decode])
    diff = (ours_all - ref).abs()
    return {
        "prompt_len": n,
        "max_abs_err": diff.max().item(),
        "max_rel_err": (diff.max() / ref.abs().max()).item(),
        "mean_abs_err": diff.mean().item(),
        "decode_max_rel_err": ((decode - ref[-1:]).abs().max() / ref[-1:].abs().max()).item(),
        "argmax_agreement": (ours_all.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        "logit_scale": ref.abs().max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-0.6b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real shape")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(args.config, Path(tmp), args.layers)
        result = {"config": args.config, "dtype": "bfloat16", **compare(Path(tmp), args.prompt_len), **environment()}
    print(
        f"bf16 parity vs transformers ({args.config}): max rel err {result['max_rel_err']:.2e} "
        f"(decode {result['decode_max_rel_err']:.2e}), mean abs err {result['mean_abs_err']:.2e}, "
        f"argmax agreement {100 * result['argmax_agreement']:.1f}%"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
