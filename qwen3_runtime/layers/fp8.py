"""Block-FP8 weights, as Qwen's FP8 checkpoints store them: e4m3 values [out, in] and one fp32 scale per 128 x 128
block, `weight_scale_inv` [ceil(out / 128), ceil(in / 128)], W ~= weight x scale. They load as stored (the scales,
bf16, fp16 or fp32 in the checkpoints, kept in fp32), or from 16-bit tensors quantized blockwise as they load
(model.quantization: fp8 over a 16-bit checkpoint or random weights), and multiply by ops/fp8_linear.py and
ops/fused_moe.py."""

from __future__ import annotations

import torch

from qwen3_runtime.layers.build import LayerBuild, parameter
from qwen3_runtime.layers.experts import ExpertWeights
from qwen3_runtime.layers.linear import LinearWeight
from qwen3_runtime.layers.loading import WeightError, check_float, check_shape, copy_checked
from qwen3_runtime.ops import cdiv
from qwen3_runtime.ops.fp8_linear import (
    fp8_gated_linear,
    fp8_linear,
    fp8_linear_partials,
    fp8_mlp_partials,
    quantize_blocks,
)
from qwen3_runtime.ops.fused_moe import fused_moe
from qwen3_runtime.quantization import FP8_BLOCK, WeightFormat

FP8 = torch.float8_e4m3fn
SCALE = "_scale_inv"  # a weight's scales: the parameter (and checkpoint tensor) of its name with this suffix


class Fp8Weight(LinearWeight):
    """A projection in block FP8. A fused one loads each part's rows and its scales' block rows, so each part must
    be a whole number of blocks: a block would otherwise mix two parts' rows under one scale."""

    def __init__(self, in_features: int, out_parts: tuple[int, ...], build: LayerBuild) -> None:
        super().__init__(in_features, out_parts)
        self.weight, self.weight_scale_inv = _parameters(build, sum(out_parts), in_features)
        self.suffixes, self.format = _suffixes(build.weights), build.weights

    def load_weight(self, suffix: str, tensor: torch.Tensor, part: int | None = None, expert: None = None) -> None:
        rows = slice(0, self.weight.shape[0]) if part is None else self.part_rows(part)
        fused = len(self.out_parts) > 1
        _load_rows(self.weight.data, self.weight_scale_inv.data, suffix != "weight", tensor, rows, fused, self.format)

    def matmul(self, x: torch.Tensor, *, dependents_early: bool = False, invariant: bool = False) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale_inv, dependents_early=dependents_early, invariant=invariant)

    def partials(self, x: torch.Tensor, *, preloaded: bool = False, invariant: bool = False) -> torch.Tensor:
        """Never preloaded (preloads: False)."""
        return fp8_linear_partials(x, self.weight, self.weight_scale_inv, invariant=invariant)

    def preloads(self, rows: int) -> bool:
        """o_proj's preloading kernel (ops/linear_preload.py) takes 16-bit weights."""
        return False

    def gated(self, x: torch.Tensor, *, invariant: bool = False) -> torch.Tensor:
        return fp8_gated_linear(x, self.weight, self.weight_scale_inv, invariant=invariant)

    def gated_partials(self, down: LinearWeight, x: torch.Tensor, *, invariant: bool = False) -> torch.Tensor:
        """One call for both when down is FP8 too (ops/fp8_linear.py's fp8_mlp_partials)."""
        if not isinstance(down, Fp8Weight):
            return super().gated_partials(down, x, invariant=invariant)
        w13, s13, w2, s2 = self.weight, self.weight_scale_inv, down.weight, down.weight_scale_inv
        return fp8_mlp_partials(x, w13, s13, w2, s2, invariant=invariant)


class Fp8Experts(ExpertWeights):
    """A MoE layer's experts in block FP8: w13_weight [E, 2I, H] with w13_weight_scale_inv [E, 2I / 128, ceil(H / 128)]
    (each expert's gate and up rows, so I must be a whole number of blocks), w2_weight [E, H, I] with
    w2_weight_scale_inv [E, ceil(H / 128), ceil(I / 128)]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, build: LayerBuild) -> None:
        super().__init__(num_experts)
        self.w13_weight, self.w13_weight_scale_inv = _parameters(build, num_experts, 2 * intermediate_size, hidden_size)
        self.w2_weight, self.w2_weight_scale_inv = _parameters(build, num_experts, hidden_size, intermediate_size)
        self.suffixes, self.format = _suffixes(build.weights), build.weights

    def load_weight(self, suffix: str, tensor: torch.Tensor, part: int | None, expert: int | None) -> None:
        """`suffix`: w13_weight, w2_weight or their scales; `part` 0 or 1: the gate or up half of w13's rows."""
        name = suffix.removesuffix(SCALE)
        weight, scale = getattr(self, name).data[expert], getattr(self, name + SCALE).data[expert]
        half = weight.shape[0] // 2
        rows = slice(0, weight.shape[0]) if part is None else slice(part * half, (part + 1) * half)
        _load_rows(weight, scale, suffix != name, tensor, rows, part is not None, self.format)

    def partials(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, invariant: bool = False
    ) -> torch.Tensor:
        return fused_moe(
            x,
            self.w13_weight,
            self.w2_weight,
            expert_ids,
            weights,
            invariant,
            w13_scale=self.w13_weight_scale_inv,
            w2_scale=self.w2_weight_scale_inv,
        )


def quantize_random(module: torch.nn.Module, name: str, gen: torch.Generator, std: float) -> None:
    """Random weights for `module`'s FP8 parameter `name` (and its scales): each [out, in] matrix drawn from
    N(0, std) in fp32, then quantized, one at a time (a MoE layer's experts would take GiBs in fp32 at once)."""
    weight, scale = getattr(module, name).data, getattr(module, name + SCALE).data
    for w, s in zip(weight.view(-1, *weight.shape[-2:]), scale.view(-1, *scale.shape[-2:])):
        _quantize_into(w, s, torch.empty(w.shape, device=w.device).normal_(0.0, std, generator=gen))


def _parameters(build: LayerBuild, *shape: int) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    """An FP8 weight of `shape` ([..., out, in]) and its fp32 block scales."""
    *lead, rows, cols = shape
    scales = parameter(build, *lead, cdiv(rows, FP8_BLOCK), cdiv(cols, FP8_BLOCK), dtype=torch.float32)
    return parameter(build, *shape, dtype=FP8), scales


def _suffixes(weights: WeightFormat) -> tuple[str, ...]:
    """A projection's checkpoint tensors: its FP8 weight and scales, or the 16-bit weight quantized as it loads."""
    return ("weight", "weight" + SCALE) if weights.from_checkpoint else ("weight",)


def _load_rows(
    weight: torch.Tensor,
    scale: torch.Tensor,
    is_scale: bool,
    tensor: torch.Tensor,
    rows: slice,
    fused: bool,
    weights: WeightFormat,
) -> None:
    """A checkpoint tensor into `rows` of weight [out, in] (an FP8 tensor, or a 16- or 32-bit one quantized here), or
    into the block rows of scale that hold those rows' scales."""
    if fused and (rows.stop - rows.start) % FP8_BLOCK:
        raise WeightError(
            f"is a part of {rows.stop - rows.start} rows of a fused FP8 projection: each part must be a multiple of "
            f"{FP8_BLOCK} rows, so that no block's scale spans two parts"
        )
    blocks = slice(rows.start // FP8_BLOCK, cdiv(rows.stop, FP8_BLOCK))
    if is_scale:
        copy_checked(scale[blocks], tensor)
        return
    check_shape(weight[rows], tensor)
    if not weights.from_checkpoint:
        check_float(tensor)
        _quantize_into(weight[rows], scale[blocks], tensor)
    elif tensor.dtype != FP8:
        raise WeightError(
            f"has dtype {tensor.dtype}, expected {FP8}, as the {weights.declared_by} declares (refused rather than "
            "served unquantized; its modules_to_not_convert keeps a module in 16 bits)"
        )
    else:
        weight[rows].copy_(tensor)


def _quantize_into(weight: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor) -> None:
    quantized, scales = quantize_blocks(dense)
    weight.copy_(quantized)
    scale.copy_(scales)
