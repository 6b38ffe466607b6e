"""A checkpoint's JSON: config.json through its family (with the key policy) and its quantization_config,
generation_config.json's end ids and sampling defaults. Torch-free."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwen3_runtime.models.registry import FAMILY_KEYS, FamilyConfig, resolve_family
from qwen3_runtime.params import SamplingParams
from qwen3_runtime.quantization import Fp8CheckpointConfig, WeightFormat
from qwen3_runtime.typed_config import ConfigError, build

if TYPE_CHECKING:
    from qwen3_runtime.config import ModelConfig

# Bookkeeping keys transformers writes (Qwen3's released configs, 4.51 to 5.x) that cannot change what the model
# computes: training, output and serialization settings, token ids the runtime does not read (bos: prompts carry
# it; pad: batches are packed), and sliding_window / max_window_layers, inert while use_sliding_window is false
# (a fixed key). Any other key a family does not honour is refused: ignoring it could serve a different model.
HF_INERT = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_cache",
        "initializer_range",
        "bos_token_id",
        "pad_token_id",
        "attention_dropout",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "id2label",
        "label2id",
        "problem_type",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "sliding_window",
        "max_window_layers",
    }
)

# The config.json key the weights' format is read from (model_weight_format), whatever the family.
WEIGHT_KEYS = frozenset({"quantization_config"})

# generation_config.json's sampling fields (those vLLM reads as request defaults) -> SamplingParams' names.
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def model_architecture(cfg: ModelConfig) -> FamilyConfig:
    """The checkpoint's shape (config.json), or the config's for random weights."""
    return read_architecture(cfg.path) if cfg.path else cfg.architecture


def model_weight_format(cfg: ModelConfig) -> WeightFormat:
    """The checkpoint's declared format (model.quantization null serves it as declared, fp8 agrees with it); for a
    checkpoint without quantization_config, or random weights, model.quantization's: fp8 quantizes the 16-bit
    weights blockwise as they load."""
    declared = _read_quantization(cfg.path) if cfg.path else None
    if declared is None:
        return WeightFormat(cfg.quantization)
    not_converted = tuple(declared.modules_to_not_convert or ())
    source = f"quantization_config of {Path(cfg.path) / 'config.json'}"
    return WeightFormat(declared.quant_method, not_converted, from_checkpoint=True, declared_by=source)


def _read_quantization(path: str | Path) -> Fp8CheckpointConfig | None:
    """The checkpoint's quantization_config (None without one), checked."""
    file = Path(path) / "config.json"
    raw = read_json(file).get("quantization_config")
    if raw is None:
        return None
    try:
        return build(Fp8CheckpointConfig, raw, "quantization_config.")
    except ConfigError as e:
        raise ConfigError(f"{file}: {e}") from None


def read_architecture(path: str | Path) -> FamilyConfig:
    """The shape from a checkpoint's config.json, read by the family its model_type names, its end-of-sequence ids
    merged with generation_config.json's as transformers does (real Qwen3 checkpoints stop on either)."""
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(f"model.path={str(path)!r} is not a directory (expected a Hugging Face checkpoint)")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path={str(path)!r}: no config.json there")
    hf = read_json(config_file)
    family = resolve_family(hf, str(config_file))
    shape = family.config_cls()
    check_keys(hf, str(config_file), family.name, shape.honoured(), shape.fixed(hf))
    arch = shape.from_hf(hf, str(config_file))
    own = _eos_ids(arch.eos_token_id)
    extra = [t for t in _generation_eos(directory) if t not in own]
    try:  # the ids are checked against the vocabulary again
        return dataclasses.replace(arch, eos_token_id=own + extra) if extra else arch
    except ConfigError as e:
        raise ConfigError(f"{directory / 'generation_config.json'}: {e}") from None


def check_keys(
    hf: Mapping[str, Any],
    where: str,
    family: str,
    honoured: frozenset[str],
    fixed: Mapping[str, tuple[object, tuple[object, ...]]],
) -> None:
    """Refuse what the model would otherwise silently compute differently from transformers: a fixed key at a value
    not implemented (`fixed`: key -> (value, allowed, None first)), or a non-null key that is neither honoured,
    fixed, the family's own (model_type, architectures), the loader's (WEIGHT_KEYS) nor HF_INERT."""
    for key, (value, allowed) in fixed.items():
        if value not in allowed:
            raise ConfigError(
                f"{where}: {key}={value!r} is not supported (supported: {', '.join(map(repr, allowed[1:]))})"
            )
    known = honoured | fixed.keys() | FAMILY_KEYS | HF_INERT | WEIGHT_KEYS
    refused = sorted(k for k, v in hf.items() if v is not None and k not in known)
    if refused:
        raise ConfigError(
            f"{where}: {', '.join(refused)} {'is' if len(refused) == 1 else 'are'} not honoured by the {family} "
            "family (it would change the model): refused rather than ignored"
        )


def rope_type(hf: Mapping[str, Any]) -> object:
    """rope_parameters' (transformers 5) or rope_scaling's type, named rope_type or, in older configs, type."""
    rope = _rope(hf)
    return rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else rope


def parse_rope(hf: Mapping[str, Any]) -> dict[str, Any]:
    """rope_theta (transformers 5 nests it in rope_parameters) and, unless the type is the default, rope_scaling,
    as the shape's fields; null scaling fields take their defaults, as in transformers."""
    rope, raw = _rope(hf), {}
    if "rope_theta" in rope:
        raw["rope_theta"] = rope["rope_theta"]
    if rope_type(hf) in (None, "default"):  # the default type has only a theta: another key would change it
        extra = sorted(k for k, v in rope.items() if k not in ("type", "rope_type", "rope_theta") and v is not None)
        if extra:
            raise ConfigError(f"unknown config key rope_parameters.{extra[0]} (the default rope type takes rope_theta)")
    else:
        scaling = {k: v for k, v in rope.items() if k not in ("type", "rope_theta") and v is not None}
        if "truncate" in rope and rope["truncate"] is None:  # but transformers and vLLM test truncate's truth
            scaling["truncate"] = False
        raw["rope_scaling"] = {**scaling, "rope_type": rope_type(hf)}
    return raw


def _rope(hf: Mapping[str, Any]) -> Any:
    return hf.get("rope_parameters") or hf.get("rope_scaling") or {}


def read_json(file: Path, error: type[ValueError] = ConfigError) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{file}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _eos_ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _generation_eos(directory: Path) -> list[int]:
    """generation_config.json's eos_token_id (an id or a list), or [] without that file."""
    file = directory / "generation_config.json"
    if not file.is_file():
        return []
    ids = _eos_ids(read_json(file).get("eos_token_id"))
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
    hf = read_json(file)
    defaults = {}
    for theirs, ours in _SAMPLING_FIELDS.items():
        if hf.get(theirs) is None:
            continue
        try:
            defaults[ours] = getattr(SamplingParams(**{ours: hf[theirs]}), ours)
        except ValueError as e:
            raise ConfigError(f"{file}: {theirs}: {e}") from None
    return defaults
