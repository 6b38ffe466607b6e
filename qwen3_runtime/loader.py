"""Build a Qwen3 model from a Hugging Face checkpoint directory, or with seeded random weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from qwen3_runtime.config import ArchitectureConfig, ModelConfig
from qwen3_runtime.device import check_weights_fit
from qwen3_runtime.input_errors import CheckpointError
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.models.hf_config import model_architecture, read_json
from qwen3_runtime.models.qwen3 import Qwen3ForCausalLM
from qwen3_runtime.models.registry import family_of

# Hugging Face projection names -> (our fused parameter, index of the shard inside it).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    """Allocate the model once on `device` (no init pass) and fill it tensor by tensor."""
    arch = model_architecture(cfg)
    model_cls, build = family_of(arch).model_cls(), LayerBuild(dtype)
    check_weights_fit(_num_weights(model_cls, arch, build) * dtype.itemsize, device, dtype)
    with torch.device("meta"):
        model = model_cls(arch, build)
    model = model.to_empty(device=device)
    if cfg.path:
        _load_checkpoint(model, Path(cfg.path))
    else:
        _init_random(model, cfg.seed)
    model.eval().requires_grad_(False)
    return model


def _num_weights(model_cls: type[Qwen3ForCausalLM], arch: ArchitectureConfig, build: LayerBuild) -> int:
    """The model's weight count (tied embeddings once), from a one-layer copy on the meta device: counted before any
    layer is built, so a shape far too large is refused at once."""
    with torch.device("meta"):
        one = model_cls(dataclasses.replace(arch, num_hidden_layers=1), build)
    tied = arch.tie_word_embeddings
    numel = sum(p.numel() for name, p in one.named_parameters() if not (tied and name == "lm_head.weight"))
    return numel + (arch.num_hidden_layers - 1) * sum(p.numel() for p in one.model.layers[0].parameters())


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, CheckpointError).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map mapping tensor names to files")
        bad = next(((k, v) for k, v in weight_map.items() if not isinstance(v, str)), None)
        if bad:  # sorted() below would raise a bare TypeError
            raise CheckpointError(f"{index}: weight_map[{bad[0]!r}]={bad[1]!r} is not a file name")
        return [path / s for s in sorted(set(weight_map.values()))]
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
    expected = _checkpoint_names(model)
    seen = set()
    for file in _checkpoint_files(path):
        try:
            seen |= _load_file(model, file, expected)
        except (SafetensorError, OSError) as e:  # truncated, empty or missing: name the file
            raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
    # Tied checkpoints omit lm_head, or (Qwen3-0.6B, 1.7B) hold a copy of the embedding: tie rather than keep a
    # second vocab x hidden tensor, as transformers and vLLM do. A different lm_head stays, as transformers keeps it.
    if model.config.tie_word_embeddings and (
        "lm_head.weight" not in seen or torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    ):
        model.tie_lm_head()
        seen.add("lm_head.weight")
    missing = sorted(set(expected) - seen)
    if missing:
        untied = " (config.json has tie_word_embeddings: false)" if missing[0] == "lm_head.weight" else ""
        raise CheckpointError(f"missing tensor {missing[0]!r} in {path}{untied} ({len(missing)} missing in all)")


def _load_file(model: Qwen3ForCausalLM, file: Path, expected: dict[str, tuple[str, int | None]]) -> set[str]:
    """Copy one safetensors file's tensors into the model; returns their names."""
    params = dict(model.named_parameters(remove_duplicate=False))
    device = next(model.parameters()).device
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
                    f"tensor {name!r} in {file.name} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                )
            if not tensor.is_floating_point() or tensor.dtype.itemsize < 2:  # copy_ would cast it without a word
                raise CheckpointError(
                    f"tensor {name!r} in {file.name} has dtype {tensor.dtype}, expected a 16- or 32-bit float "
                    "(quantized checkpoints are not supported)"
                )
            dest.copy_(tensor)
        return set(f.keys())


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
