"""The Qwen3-MoE family's shape (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's, with sparse mixture-of-experts layers.
Torch-free, as qwen3_config.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from qwen3_runtime.models.qwen3_config import Qwen3Config
from qwen3_runtime.typed_config import ConfigError, size_bounds

# config.json keys of transformers' Qwen3MoeConfig that only training reads (the router's auxiliary loss).
_TRAINING_ONLY = frozenset({"output_router_logits", "router_aux_loss_coef"})


@dataclass(frozen=True)
class Qwen3MoeConfig(Qwen3Config):
    """Layer i is a sparse MoE block when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    (transformers' rule), else the dense MLP of intermediate_size. No shared expert (Qwen2-MoE's is refused)."""

    num_experts: int = field(kw_only=True, metadata=size_bounds(1))
    num_experts_per_tok: int = field(kw_only=True, metadata=size_bounds(1))
    moe_intermediate_size: int = field(kw_only=True, metadata=size_bounds(1))
    # Required: the released models renormalise (true), transformers' default does not (false).
    norm_topk_prob: bool = field(kw_only=True)
    decoder_sparse_step: int = field(default=1, kw_only=True, metadata=size_bounds(1))
    mlp_only_layers: list[int] = field(default_factory=list, kw_only=True)

    # transformers' Qwen3MoeConfig has no head_dim default: absent, it is hidden_size // num_attention_heads.
    hf_defaults: ClassVar[dict[str, Any]] = {
        **Qwen3Config.hf_defaults,
        "head_dim": None,
        "norm_topk_prob": False,
        "decoder_sparse_step": 1,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_experts_per_tok > self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok={self.num_experts_per_tok} is out of range: must be <= "
                f"num_experts={self.num_experts}"
            )
        if not all(0 <= i < self.num_hidden_layers for i in self.mlp_only_layers):
            raise ConfigError(
                f"mlp_only_layers={self.mlp_only_layers} is out of range: each index must be in "
                f"[0, {self.num_hidden_layers}) (num_hidden_layers)"
            )

    @classmethod
    def honoured(cls) -> frozenset[str]:
        return super().honoured() | {"num_local_experts"} | _TRAINING_ONLY

    @classmethod
    def hf_fields(cls, hf: Mapping[str, Any]) -> dict[str, Any]:
        """As Qwen3's, with transformers 5's num_local_experts for num_experts and a null mlp_only_layers as []."""
        raw = super().hf_fields(hf)
        if raw.get("mlp_only_layers") is None:
            raw["mlp_only_layers"] = []
        local = hf.get("num_local_experts")
        if local is not None:
            if raw.get("num_experts", local) != local:
                raise ConfigError(
                    f"num_experts={raw['num_experts']!r} and num_local_experts={local!r} differ (transformers 5 "
                    "names num_experts num_local_experts): give one, or both equal"
                )
            raw["num_experts"] = local
        return raw

    def is_sparse_layer(self, index: int) -> bool:
        return index not in self.mlp_only_layers and (index + 1) % self.decoder_sparse_step == 0

    @property
    def num_sparse_layers(self) -> int:
        """Counted without visiting every layer (a shape far too large is refused before it is built)."""
        step = self.decoder_sparse_step
        return self.num_hidden_layers // step - sum((i + 1) % step == 0 for i in set(self.mlp_only_layers))

    def layer_samples(self) -> tuple[Qwen3MoeConfig, tuple[int, ...]]:
        """A sparse layer first, then a dense one, of those kinds the shape has."""
        sparse = self.num_sparse_layers
        counts = tuple(n for n in (sparse, self.num_hidden_layers - sparse) if n)
        dense_index = [len(counts) - 1] if sparse < self.num_hidden_layers else []
        sample = dataclasses.replace(
            self, num_hidden_layers=len(counts), decoder_sparse_step=1, mlp_only_layers=dense_index
        )
        return sample, counts
