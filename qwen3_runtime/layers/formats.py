"""A projection's or a MoE layer's experts' weight object in the format the build gives the checkpoint modules it
holds (LayerBuild.fp8): the one place that picks a weight class, so the layers never name one."""

from __future__ import annotations

from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.experts import ExpertWeights, UnquantizedExperts
from qwen3_runtime.layers.fp8 import Fp8Experts, Fp8Weight
from qwen3_runtime.layers.linear import LinearWeight, UnquantizedWeight

EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def projection(build: LayerBuild, in_features: int, parts: dict[str, int]) -> LinearWeight:
    """The checkpoint projections `parts` (name: output size, fused in this order) as one weight."""
    cls = Fp8Weight if build.fp8(*parts) else UnquantizedWeight
    return cls(in_features, tuple(parts.values()), build)


def experts(build: LayerBuild, num_experts: int, hidden_size: int, intermediate_size: int) -> ExpertWeights:
    """Every expert's projections (`build` at the experts' module), stacked."""
    names = [f"{e}.{name}" for e in range(num_experts) for name in EXPERT_PROJECTIONS]
    cls = Fp8Experts if build.fp8(*names) else UnquantizedExperts
    return cls(num_experts, hidden_size, intermediate_size, build)
