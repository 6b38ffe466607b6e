"""The dense Qwen3 family's shape: torch-free, since config.py (and so the API process) imports it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from qwen3_runtime.models.hf_config import parse_rope, rope_type
from qwen3_runtime.typed_config import ConfigError, bounds, build, size_bounds


@dataclass(frozen=True)
class RopeScaling:
    """YaRN, how Qwen3 serves contexts past the 32,768 tokens it was trained on; named as in config.json's
    rope_scaling (transformers 5: rope_parameters)."""

    rope_type: Literal["yarn"]
    factor: float = field(metadata=bounds(1))
    original_max_position_embeddings: int = field(metadata=size_bounds(1))
    # Frequencies turning more than beta_fast times over the original context are kept, fewer than beta_slow
    # times divided by the factor, those between ramped; truncate rounds those bounds to whole dimensions.
    beta_fast: float = field(default=32.0, metadata=bounds(0, lo_open=True))
    beta_slow: float = field(default=1.0, metadata=bounds(0, lo_open=True))
    truncate: bool = True
    # cos and sin are multiplied by it; None: 0.1 ln(factor) + 1, the YaRN paper's.
    attention_factor: float | None = field(default=None, metadata=bounds(0, lo_open=True))

    def __post_init__(self) -> None:
        if self.beta_fast < self.beta_slow:
            raise ConfigError(f"beta_fast={self.beta_fast} must be >= beta_slow={self.beta_slow}")


@dataclass(frozen=True)
class Qwen3Config:
    """The dense Qwen3 shape, named as in Hugging Face's config.json; model.architecture when no checkpoint is
    given."""

    vocab_size: int = field(metadata=size_bounds(1))
    hidden_size: int = field(metadata=size_bounds(1))
    intermediate_size: int = field(metadata=size_bounds(1))
    num_hidden_layers: int = field(metadata=size_bounds(1))
    num_attention_heads: int = field(metadata=size_bounds(1))
    num_key_value_heads: int = field(metadata=size_bounds(1))
    head_dim: int = field(default=128, metadata=size_bounds(2))
    rms_norm_eps: float = field(default=1e-6, metadata=bounds(0, lo_open=True))
    rope_theta: float = field(default=1e6, metadata=bounds(0, lo_open=True))
    max_position_embeddings: int = field(default=40960, metadata=size_bounds(1))
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    eos_token_id: int | list[int] | None = None

    # transformers' defaults for keys a config.json may omit (None: computed, as head_dim); the dataclass's own are
    # the released models' values (for random weights), and taking those would silently change the rotary embedding
    # or the head size.
    hf_defaults: ClassVar[dict[str, Any]] = {"head_dim": 128, "rope_theta": 10000.0, "max_position_embeddings": 32768}

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even (rotary embedding)")
        if not all(0 <= t < self.vocab_size for t in self.eos_token_ids):
            raise ConfigError(
                f"eos_token_id={self.eos_token_id!r} is out of range: each id must be in [0, {self.vocab_size}) "
                "(vocab_size)"
            )

    @classmethod
    def honoured(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls)) | {"rope_parameters"}

    @classmethod
    def fixed(cls, hf: Mapping[str, Any]) -> dict[str, tuple[object, tuple[object, ...]]]:
        """What this family implements of keys that transformers' Qwen3 reads at other values too."""
        layer_types = hf.get("layer_types") or ()
        return {
            "hidden_act": (hf.get("hidden_act"), (None, "silu")),
            "attention_bias": (hf.get("attention_bias"), (None, False)),
            "use_sliding_window": (hf.get("use_sliding_window"), (None, False)),
            "layer_types": (next((t for t in layer_types if t != "full_attention"), None), (None, "full_attention")),
            "rope_parameters.rope_type": (rope_type(hf), (None, "default", "yarn")),
        }

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], where: str) -> Qwen3Config:
        """The shape from config.json (its keys checked by hf_config.check_keys)."""
        try:
            return build(cls, cls.hf_fields(hf), "")
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    @classmethod
    def hf_fields(cls, hf: Mapping[str, Any]) -> dict[str, Any]:
        """config.json's values of the shape's fields: absent keys take transformers' defaults (hf_defaults), head_dim
        hidden_size / num_attention_heads when null."""
        names = {f.name for f in fields(cls)}
        raw = {k: v for k, v in hf.items() if k in names and k != "rope_scaling"}
        raw.update(parse_rope(hf))
        for key, value in cls.hf_defaults.items():  # absent (not null)
            raw.setdefault(key, value)
        if raw.get("head_dim") is None:
            raw.pop("head_dim", None)
            with contextlib.suppress(KeyError, TypeError, ZeroDivisionError):  # else build names the bad key
                raw["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
        return raw

    def layer_samples(self) -> tuple[Qwen3Config, tuple[int, ...]]:
        """This shape with one decoder layer of each kind, and how many layers of each kind it has: the loader counts
        the weights' bytes from them without building every layer."""
        return dataclasses.replace(self, num_hidden_layers=1), (self.num_hidden_layers,)

    @property
    def max_context(self) -> int:
        """The most positions the model serves: max_position_embeddings, or with YaRN its original context times
        its factor (vLLM's rule: Qwen3's 32,768 × 4 = 131,072 while config.json keeps 40,960)."""
        if self.rope_scaling is None:
            return self.max_position_embeddings
        return int(self.rope_scaling.original_max_position_embeddings * self.rope_scaling.factor)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        return tuple(self.eos_token_id) if isinstance(self.eos_token_id, list) else (self.eos_token_id,)
