"""Tiny block-FP8 checkpoints as Qwen's (Qwen3-*-FP8) are stored, made from transformers' own tiny checkpoints, each
with its dequantized twin: a checkpoint of exactly the weights the FP8 one holds, transformers' parity reference."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from qwen3_runtime.ops.fp8_linear import dequantize_blocks, quantize_blocks

# Shapes whose fused parts (q 256, k and v 128 rows; gate and up 256, the experts' 128) are whole 128-row blocks
# and whose hidden size (160) is not, so every projection by or to it has a partial last block.
FP8_DENSE = dict(
    hidden_size=160,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=256,
    num_hidden_layers=2,
    tie_word_embeddings=False,
)
# Layers 0 and 2 sparse (4 experts, top 2), layer 1 the dense MLP.
FP8_MOE = dict(
    FP8_DENSE,
    num_hidden_layers=3,
    moe=dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    ),
)
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantization_config(keep: list[str]) -> dict:
    """config.json's quantization_config as Qwen3-30B-A3B-FP8's (its keys, its order)."""
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": keep,
    }


def write_fp8(source: Path, dest: Path, twin: Path, scale_dtype: torch.dtype, keep: list[str]) -> None:
    """`dest`: `source` with every projection quantized blockwise (`weight` e4m3, `weight_scale_inv` in scale_dtype)
    but those of the modules `keep` names (modules_to_not_convert, each entry a whole-segment part of the name), and
    its quantization_config; `twin`: `source` with the weights `dest` stands for, in fp32 (weight x scale is not
    always a bf16 number)."""
    stored, dense = {}, {}
    for name, tensor in load_file(source / "model.safetensors").items():
        module = name.removesuffix(".weight")
        if module.rpartition(".")[2] in QUANTIZED and not any(f".{k}." in f".{module}." for k in keep):
            weight, scale = quantize_blocks(tensor)
            scale = scale.to(scale_dtype)
            stored |= {name: weight, f"{name}_scale_inv": scale}
            dense[name] = dequantize_blocks(weight, scale.float())
        else:
            stored[name], dense[name] = tensor, tensor.float()
    for path, tensors in ((dest, stored), (twin, dense)):
        shutil.copytree(source, path)
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config(keep)}))


def edit_tensors(path: Path, edit) -> None:
    """Rewrite a one-file checkpoint's tensors by `edit(tensors)`, in place."""
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def edit_config(path: Path, **edits) -> None:
    """Set config.json keys (None deletes one)."""
    config = json.loads((path / "config.json").read_text()) | edits
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
