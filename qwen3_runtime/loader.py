"""Build a Qwen3 model from a Hugging Face checkpoint directory, or with seeded random weights."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from qwen3_runtime.config import ArchitectureConfig, ConfigError, ModelConfig
from qwen3_runtime.device import check_weights_fit
from qwen3_runtime.input_errors import CheckpointError
from qwen3_runtime.model import Qwen3ForCausalLM
from qwen3_runtime.params import SamplingParams
from qwen3_runtime.typed_config import build

# Hugging Face projection names -> (our fused parameter, index of the shard inside it).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


# generation_config.json's sampling fields (those vLLM reads as request defaults) -> SamplingParams' names.
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


# Qwen3Config's defaults for keys a config.json may omit; ArchitectureConfig's own are the released models' values
# (for random weights), and taking those would silently change the rotary embedding or the head size.
_QWEN3_CONFIG_DEFAULTS = {"head_dim": 128, "rope_theta": 10000.0, "max_position_embeddings": 32768}


def read_architecture(path: str | Path) -> ArchitectureConfig:
    """The shape from a checkpoint's config.json (unknown keys ignored), its end-of-sequence ids merged
    with generation_config.json's as transformers does (real Qwen3 checkpoints stop on either)."""
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(f"model.path={str(path)!r} is not a directory (expected a Hugging Face checkpoint)")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path={str(path)!r}: no config.json there")
    hf = _read_json(config_file)
    _check_supported(hf, config_file)
    names = ArchitectureConfig.__dataclass_fields__
    raw = {k: v for k, v in hf.items() if k in names and k != "rope_scaling"}
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if "rope_theta" in rope:  # transformers 5 nests it
        raw["rope_theta"] = rope["rope_theta"]
    if _rope_type(rope) not in (None, "default"):  # null fields take their defaults, as in transformers
        scaling = {k: v for k, v in rope.items() if k not in ("type", "rope_theta") and v is not None}
        if "truncate" in rope and rope["truncate"] is None:  # but transformers and vLLM test truncate's truth
            scaling["truncate"] = False
        raw["rope_scaling"] = {**scaling, "rope_type": _rope_type(rope)}
    for key, value in _QWEN3_CONFIG_DEFAULTS.items():  # absent (not null): what transformers' Qwen3Config fills in
        raw.setdefault(key, value)
    if raw.get("head_dim") is None:
        raw.pop("head_dim", None)
        with contextlib.suppress(KeyError, TypeError, ZeroDivisionError):  # else _build names the bad key
            raw["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    try:
        arch = build(ArchitectureConfig, raw, "")
    except ConfigError as e:
        raise ConfigError(f"{config_file}: {e}") from None
    own = _eos_ids(arch.eos_token_id)
    extra = [t for t in _generation_eos(directory) if t not in own]
    try:  # the ids are checked against the vocabulary again
        return dataclasses.replace(arch, eos_token_id=own + extra) if extra else arch
    except ConfigError as e:
        raise ConfigError(f"{directory / 'generation_config.json'}: {e}") from None


def _read_json(file: Path, error: type[ValueError] = ConfigError) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{file}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _check_supported(hf: dict, config_file: Path) -> None:
    """Reject what the model would otherwise silently compute differently from transformers."""
    rope_type = _rope_type(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    supported = {  # key: (its value, the values this runtime implements)
        "model_type": (hf.get("model_type"), (None, "qwen3")),
        "hidden_act": (hf.get("hidden_act"), (None, "silu")),
        "attention_bias": (hf.get("attention_bias"), (None, False)),
        "use_sliding_window": (hf.get("use_sliding_window"), (None, False)),
        "rope_parameters.rope_type": (rope_type, (None, "default", "yarn")),
    }
    for key, (value, allowed) in supported.items():
        if value not in allowed:
            raise ConfigError(
                f"{config_file}: {key}={value!r} is not supported (supported: {', '.join(map(repr, allowed[1:]))})"
            )


def _rope_type(rope: object) -> object:
    """rope_scaling's (or rope_parameters') type, named rope_type or, in older configs, type."""
    return rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else rope


def _eos_ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _generation_eos(directory: Path) -> list[int]:
    """generation_config.json's eos_token_id (an id or a list), or [] without that file."""
    file = directory / "generation_config.json"
    if not file.is_file():
        return []
    ids = _eos_ids(_read_json(file).get("eos_token_id"))
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ConfigError(f"{file}: eos_token_id={ids!r} is invalid: expected an int or a list of int")
    return ids


def read_sampling_defaults(path: str | Path) -> dict[str, Any]:
    """The sampling fields the checkpoint's generation_config.json sets, by SamplingParams' names ({} without the
    file): the model creator's recommended values, which requests leaving those fields unset take (vLLM's
    `--generation-config auto`). Its do_sample is ignored, as vLLM ignores it: temperature 0 is greedy."""
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        return {}
    hf = _read_json(file)
    defaults = {}
    for theirs, ours in _SAMPLING_FIELDS.items():
        if hf.get(theirs) is None:
            continue
        try:
            defaults[ours] = getattr(SamplingParams(**{ours: hf[theirs]}), ours)
        except ValueError as e:
            raise ConfigError(f"{file}: {theirs}: {e}") from None
    return defaults


def model_architecture(cfg: ModelConfig) -> ArchitectureConfig:
    """The checkpoint's shape (config.json), or the config's for random weights."""
    return read_architecture(cfg.path) if cfg.path else cfg.architecture


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    """Allocate the model once on `device` (no init pass) and fill it tensor by tensor."""
    arch = model_architecture(cfg)
    check_weights_fit(_num_weights(arch) * dtype.itemsize, device, dtype)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(arch)
    model = model.to(dtype).to_empty(device=device)
    if cfg.path:
        _load_checkpoint(model, Path(cfg.path))
    else:
        _init_random(model, cfg.seed)
    model.eval().requires_grad_(False)
    return model


def _num_weights(arch: ArchitectureConfig) -> int:
    """The model's weight count (tied embeddings once), from a one-layer copy on the meta device: counted before any
    layer is built, so a shape far too large is refused at once."""
    with torch.device("meta"):
        one = Qwen3ForCausalLM(dataclasses.replace(arch, num_hidden_layers=1))
    tied = arch.tie_word_embeddings
    numel = sum(p.numel() for name, p in one.named_parameters() if not (tied and name == "lm_head.weight"))
    return numel + (arch.num_hidden_layers - 1) * sum(p.numel() for p in one.model.layers[0].parameters())


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, CheckpointError).get("weight_map")
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
