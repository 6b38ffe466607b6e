"""Which family a checkpoint's config.json names, and its classes, imported on first use: the shape is torch-free
(config.py and the API process read it), the model is not."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from qwen3_runtime.typed_config import ConfigError

# The config.json keys resolve_family reads (so no family's key policy refuses them).
FAMILY_KEYS = frozenset({"model_type", "architectures"})


class FamilyConfig(Protocol):
    """What the loader asks of a family's shape (a frozen dataclass named as in config.json)."""

    eos_token_id: int | list[int] | None

    @classmethod
    def honoured(cls) -> frozenset[str]:
        """The config.json keys the family reads."""

    @classmethod
    def fixed(cls, hf: Mapping[str, Any]) -> dict[str, tuple[object, tuple[object, ...]]]:
        """Keys accepted at one value only: key -> (its value in `hf`, the values implemented, None first)."""

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], where: str) -> FamilyConfig:
        """The shape from a config.json whose keys check_keys has accepted."""


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json's model_type values
    architectures: tuple[str, ...]  # config.json's architectures values
    config: str  # "module:class" of its FamilyConfig (torch-free)
    model: str  # "module:class" of its nn.Module (imports torch)

    def config_cls(self) -> type[FamilyConfig]:
        return _import(self.config)

    def model_cls(self) -> type:
        return _import(self.model)


FAMILIES = (
    Family(
        "qwen3",
        ("qwen3",),
        ("Qwen3ForCausalLM",),
        "qwen3_runtime.models.qwen3_config:Qwen3Config",
        "qwen3_runtime.models.qwen3:Qwen3ForCausalLM",
    ),
    Family(
        "qwen3_moe",
        ("qwen3_moe",),
        ("Qwen3MoeForCausalLM",),
        "qwen3_runtime.models.qwen3_moe_config:Qwen3MoeConfig",
        "qwen3_runtime.models.qwen3_moe:Qwen3MoeForCausalLM",
    ),
)


def resolve_family(hf: Mapping[str, Any], where: str) -> Family:
    """The family of config.json's model_type (absent: qwen3, the first); architectures, when given, must name one
    of its classes, since another head (a classifier, say) would be loaded as a language model."""
    model_type = hf.get("model_type")
    family = next((f for f in FAMILIES if model_type is None or model_type in f.model_types), None)
    if family is None:
        supported = ", ".join(repr(t) for f in FAMILIES for t in f.model_types)
        raise ConfigError(f"{where}: model_type={model_type!r} is not supported (supported: {supported})")
    architectures = hf.get("architectures")
    if architectures is not None and (
        not isinstance(architectures, list) or not all(a in family.architectures for a in architectures)
    ):
        raise ConfigError(
            f"{where}: architectures={architectures!r} is not supported for model_type={family.name!r} "
            f"(supported: {', '.join(map(repr, family.architectures))})"
        )
    return family


def family_of(cfg: object) -> Family:
    """The family whose shape `cfg` is (random weights have no config.json to resolve)."""
    return next(f for f in FAMILIES if type(cfg) is f.config_cls())


def _import(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)
