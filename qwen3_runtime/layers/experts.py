"""A MoE layer's experts: every expert's projections stacked in a few parameters, in the format the build gives them
(layers/formats.py), and the kernel that multiplies by them."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from qwen3_runtime.layers.build import LayerBuild, parameter
from qwen3_runtime.layers.loading import Route, copy_checked
from qwen3_runtime.ops.fused_moe import fused_moe


class ExpertWeights(nn.Module):
    """Every expert's projections stacked along a leading expert axis: w13 [E, 2I, H] (gate rows, then up rows) and
    w2 [E, H, I], filled from the checkpoint's per-expert tensors. Like a LinearWeight, it owns its tensors and picks
    the kernels, so another format (FP8's blocks and scales: more suffixes, layers/fp8.py) is another subclass."""

    suffixes: tuple[str, ...] = ("weight",)  # its tensors per checkpoint projection

    def __init__(self, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts

    def checkpoint_routes(self) -> Iterator[tuple[str, Route]]:
        """`{e}.gate_proj.weight` and `up_proj` are expert e's halves of w13_weight, `down_proj` its w2_weight (and
        likewise for a format's other tensors: its suffixes)."""
        for expert in range(self.num_experts):
            for suffix in self.suffixes:
                yield f"{expert}.gate_proj.{suffix}", Route(self, f"w13_{suffix}", 0, expert)
                yield f"{expert}.up_proj.{suffix}", Route(self, f"w13_{suffix}", 1, expert)
                yield f"{expert}.down_proj.{suffix}", Route(self, f"w2_{suffix}", None, expert)

    def load_weight(self, suffix: str, tensor: torch.Tensor, part: int | None, expert: int | None) -> None:
        """`suffix` names the stacked parameter; `part` 0 or 1 is the gate or up half of w13's rows."""
        dest = getattr(self, suffix).data[expert]
        copy_checked(dest if part is None else dest.chunk(2)[part], tensor)

    def partials(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, invariant: bool = False
    ) -> torch.Tensor:
        """The routed experts' weighted outputs as [k, T, hidden] fp32 partial sums (ops/fused_moe.py)."""
        raise NotImplementedError


class UnquantizedExperts(ExpertWeights):
    """16- or 32-bit float experts, multiplied by ops/fused_moe.py."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, build: LayerBuild) -> None:
        super().__init__(num_experts)
        self.w13_weight = parameter(build, num_experts, 2 * intermediate_size, hidden_size)
        self.w2_weight = parameter(build, num_experts, hidden_size, intermediate_size)

    def partials(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, invariant: bool = False
    ) -> torch.Tensor:
        return fused_moe(x, self.w13_weight, self.w2_weight, expert_ids, weights, invariant)
