"""Which projections hold block-FP8 weights: config.json's quantization_config as Qwen's FP8 checkpoints write it
(models/hf_config.py reads it), or model.quantization. Torch-free, as models/hf_config.py, which builds them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from qwen3_runtime.typed_config import ConfigError

FP8_BLOCK = 128  # rows and columns of a weight block that shares one scale


@dataclass(frozen=True)
class Fp8CheckpointConfig:
    """config.json's quantization_config of a block-FP8 checkpoint (Qwen3-*-FP8, as DeepSeek's): each projection's
    `weight` in e4m3 [out, in] and its `weight_scale_inv` [ceil(out / 128), ceil(in / 128)], W ~= weight x scale per
    128 x 128 block; activations quantized on the fly (dynamic). Anything else is refused, naming the key: static
    activations need input scales this runtime does not read, other blocks or formats other kernels."""

    quant_method: Literal["fp8"]
    weight_block_size: list[int]
    fmt: Literal["e4m3"] = "e4m3"
    activation_scheme: Literal["dynamic"] = "dynamic"
    # Modules kept in 16 bits (WeightFormat.fp8's rule); Qwen's list lm_head, the norms and the MoE routers, which
    # are 16-bit here anyway.
    modules_to_not_convert: list[str] | None = None

    def __post_init__(self) -> None:
        if self.weight_block_size != [FP8_BLOCK, FP8_BLOCK]:
            raise ConfigError(
                f"weight_block_size={self.weight_block_size!r} is not supported (supported: [{FP8_BLOCK}, {FP8_BLOCK}])"
            )


@dataclass(frozen=True)
class WeightFormat:
    """How the projections (q, k, v, o, gate, up, down and the experts') are stored: in the model's dtype
    (quantization None), or in block FP8 but for the modules `not_converted` names. Embeddings, lm_head, norms and
    MoE routers are always in the model's dtype."""

    quantization: Literal["fp8"] | None = None
    not_converted: tuple[str, ...] = ()
    # The checkpoint holds FP8 tensors and their scales; else its 16-bit tensors (or random weights) are quantized
    # as they load.
    from_checkpoint: bool = False
    declared_by: str = "model.quantization=fp8"  # for errors: what asked for FP8

    def fp8(self, module: str) -> bool:
        """Whether the projection `module` (its checkpoint name: model.layers.3.self_attn.q_proj) is FP8. An entry of
        not_converted keeps it 16-bit when it occurs in that name between dots: `lm_head`, `self_attn`,
        `layers.3.mlp`, the full name. That is vLLM's substring rule (is_layer_skipped with skip_with_substr; its
        default matches full names only, which this rule keeps) held to whole name segments, so that `mlp.gate` (the
        router, which Qwen's MoE checkpoints list) does not match `mlp.gate_proj`, nor `layers.1` `layers.10`."""
        dotted = f".{module}."
        return self.quantization == "fp8" and not any(entry in dotted for entry in self._dotted_entries)

    @functools.cached_property
    def _dotted_entries(self) -> tuple[str, ...]:
        return tuple(f".{entry}." for entry in self.not_converted)
