"""Build a Qwen3 model from a Hugging Face checkpoint directory, or with seeded random weights."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from qwen3_runtime.config import ArchitectureConfig, ModelConfig
from qwen3_runtime.device import check_weights_fit
from qwen3_runtime.input_errors import CheckpointError
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.fp8 import FP8, SCALE, quantize_random
from qwen3_runtime.layers.loading import Route, WeightError, routes
from qwen3_runtime.models.hf_config import model_architecture, model_weight_format, read_json
from qwen3_runtime.models.qwen3 import Qwen3ForCausalLM
from qwen3_runtime.models.registry import family_of


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    """Allocate the model once on `device` (no init pass) and fill it tensor by tensor."""
    arch = model_architecture(cfg)
    model_cls, build = family_of(arch).model_cls(), LayerBuild(dtype, model_weight_format(cfg))
    check_weights_fit(_weight_bytes(model_cls, arch, build), device, dtype, fp8=build.weights.quantization == "fp8")
    with torch.device("meta"):
        model = model_cls(arch, build)
    model = model.to_empty(device=device)
    if cfg.path:
        _load_checkpoint(model, Path(cfg.path))
    else:
        _init_random(model, cfg.seed)
    model.eval().requires_grad_(False)
    return model


def _weight_bytes(model_cls: type[Qwen3ForCausalLM], arch: ArchitectureConfig, build: LayerBuild) -> int:
    """The model's weight bytes (tied embeddings once, FP8 scales included), from a copy with one layer of each kind (a
    MoE model's sparse and dense layers differ) on the meta device: counted before any layer is built, so a shape far
    too large is refused at once. Each layer counts as its kind's first (exact unless modules_to_not_convert keeps
    some layers' projections in 16 bits and not others')."""
    sample, counts = arch.layer_samples()
    with torch.device("meta"):
        model = model_cls(sample, build)
    tied = arch.tie_word_embeddings
    ends = sum(
        p.nbytes
        for name, p in model.named_parameters()
        if not name.startswith("model.layers.") and not (tied and name == "lm_head.weight")
    )
    return ends + sum(n * sum(p.nbytes for p in layer.parameters()) for layer, n in zip(model.model.layers, counts))


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


def _load_checkpoint(model: Qwen3ForCausalLM, path: Path) -> None:
    expected = dict(routes(model))
    device = next(model.parameters()).device
    seen = set()
    for file in _checkpoint_files(path):
        try:
            seen |= _load_file(file, expected, device)
        except (SafetensorError, OSError) as e:  # truncated, empty or missing: name the file
            raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
    seen |= model.after_load(seen)
    missing = sorted(set(expected) - seen)
    if missing:
        untied = " (config.json has tie_word_embeddings: false)" if missing[0] == "lm_head.weight" else ""
        raise CheckpointError(f"missing tensor {missing[0]!r} in {path}{untied} ({len(missing)} missing in all)")


def _load_file(file: Path, expected: dict[str, Route], device: torch.device) -> set[str]:
    """Copy one safetensors file's tensors along their routes; returns their names."""
    with safe_open(str(file), framework="pt", device=str(device)) as f:
        for name in f.keys():
            if name not in expected:
                raise CheckpointError(f"unexpected tensor {name!r} in {file.name}")
            try:
                expected[name].load(f.get_tensor(name))
            except WeightError as e:
                raise CheckpointError(f"tensor {name!r} in {file.name} {e}") from None
        return set(f.keys())


def _init_random(model: Qwen3ForCausalLM, seed: int) -> None:
    """N(0, 0.02) weights and unit norms, like a fresh Hugging Face model; FP8 weights drawn so, then quantized."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    if model.config.tie_word_embeddings:
        model.tie_lm_head()
    for name, p in model.named_parameters():
        owner, _, suffix = name.rpartition(".")
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        elif p.dtype == FP8:
            quantize_random(model.get_submodule(owner), suffix, gen, 0.02)
        elif not name.endswith(SCALE):  # a scale is set with its weight
            p.data.normal_(0.0, 0.02, generator=gen)
