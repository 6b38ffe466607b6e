"""Build a Qwen3 model from a Hugging Face checkpoint directory, or with seeded random weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from qwen3_runtime.config import ArchitectureConfig, ConfigError, ModelConfig
from qwen3_runtime.device import check_weights_fit
from qwen3_runtime.model import Qwen3ForCausalLM

# Hugging Face projection names -> (our fused parameter, index of the shard inside it).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


class CheckpointError(ValueError):
    """A checkpoint that does not match the model; the message names the tensor."""


def read_architecture(path: str | Path) -> ArchitectureConfig:
    """The shape from a checkpoint's config.json (unknown keys ignored)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path={str(path)!r}: no config.json there")
    hf = json.loads(config_file.read_text())
    if hf.get("model_type") not in (None, "qwen3"):
        raise ConfigError(f"model.path={str(path)!r}: model_type {hf['model_type']!r} is not qwen3")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"model.path={str(path)!r}: rope type {rope.get('rope_type')!r} is not supported")
    if hf.get("use_sliding_window"):
        raise ConfigError(f"model.path={str(path)!r}: sliding-window attention is not supported")
    names = ArchitectureConfig.__dataclass_fields__
    kwargs = {k: v for k, v in hf.items() if k in names}
    if "rope_theta" in rope:  # transformers 5 nests it
        kwargs["rope_theta"] = rope["rope_theta"]
    if kwargs.get("head_dim") is None:
        kwargs["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    return ArchitectureConfig(**kwargs)


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    """Allocate the model once on `device` (no init pass) and fill it tensor by tensor."""
    arch = read_architecture(cfg.path) if cfg.path else cfg.architecture
    with torch.device("meta"):
        model = Qwen3ForCausalLM(arch)
    tied = arch.tie_word_embeddings
    numel = sum(p.numel() for name, p in model.named_parameters() if not (tied and name == "lm_head.weight"))
    check_weights_fit(numel * dtype.itemsize, device, dtype)
    model = model.to(dtype).to_empty(device=device)
    if cfg.path:
        _load_checkpoint(model, Path(cfg.path))
    else:
        _init_random(model, cfg.seed)
    model.eval().requires_grad_(False)
    return model


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"{path}: neither model.safetensors nor model.safetensors.index.json")


def _checkpoint_names(model: Qwen3ForCausalLM) -> dict[str, tuple[str, int | None]]:
    """Every tensor name a checkpoint must hold -> (our parameter, shard index or None)."""
    names = {}
    for param_name, _ in model.named_parameters(remove_duplicate=False):
        fused = [(hf, shard) for hf, (ours, shard) in _FUSED.items() if f".{ours}." in param_name]
        for hf_part, shard in fused:
            ours = _FUSED[hf_part][0]
            names[param_name.replace(ours, hf_part)] = (param_name, shard)
        if not fused:
            names[param_name] = (param_name, None)
    return names


def _shard_slice(param_name: str, shard: int, cfg: ArchitectureConfig) -> slice:
    if "qkv_proj" in param_name:
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        starts = [0, q, q + kv, q + 2 * kv]
    else:
        starts = [0, cfg.intermediate_size, 2 * cfg.intermediate_size]
    return slice(starts[shard], starts[shard + 1])


def _load_checkpoint(model: Qwen3ForCausalLM, path: Path) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    expected = _checkpoint_names(model)
    device = next(model.parameters()).device
    seen = set()
    for file in _checkpoint_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in f.keys():
                if name not in expected:
                    raise CheckpointError(f"unexpected tensor {name!r} in {file.name}")
                param_name, shard = expected[name]
                dest = params[param_name].data
                if shard is not None:
                    dest = dest[_shard_slice(param_name, shard, model.config)]
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(dest.shape):
                    raise CheckpointError(
                        f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                    )
                dest.copy_(tensor)
                seen.add(name)
    if "lm_head.weight" not in seen:  # tied embeddings: checkpoints omit lm_head
        model.tie_lm_head()
        seen.add("lm_head.weight")
    missing = sorted(set(expected) - seen)
    if missing:
        raise CheckpointError(f"missing tensor {missing[0]!r} in {path} ({len(missing)} missing in all)")


def _init_random(model: Qwen3ForCausalLM, seed: int) -> None:
    """N(0, 0.02) weights and unit norms, like a fresh Hugging Face model."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    if model.config.tie_word_embeddings:
        model.tie_lm_head()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        else:
            p.data.normal_(0.0, 0.02, generator=gen)
