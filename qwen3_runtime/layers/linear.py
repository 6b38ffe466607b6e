"""A projection's weight: it owns its tensors and picks the kernels that multiply by them, so the layers call
methods, never a kernel on a tensor, and another format (FP8's blocks and scales) is another subclass."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from qwen3_runtime.layers.build import LayerBuild, parameter
from qwen3_runtime.layers.loading import Route, copy_checked
from qwen3_runtime.ops.invariant_linear import invariant_linear
from qwen3_runtime.ops.linear import gated_linear, linear, linear_partials, mlp_partials
from qwen3_runtime.ops.linear_preload import preload_applies, preloaded_partials


def fp32_product(
    x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, invariant: bool = False
) -> torch.Tensor:
    """x [T, in] times weight [out, in] in fp32 (into `out` when given): lm_head's logits and the MoE router's. On the
    GPU the 16-bit operands accumulate in fp32 and the product is written in fp32 directly: rounded to bf16, a logit
    of 20 would only be good to +-0.06. invariant: by the batch-invariant kernel (engine.batch_invariant)."""
    if invariant:
        product = invariant_linear(x, weight, out_dtype=torch.float32)
    elif x.is_cuda and x.dtype != torch.float32:
        if out is None:
            return torch.mm(x, weight.t(), out_dtype=torch.float32)
        return torch.mm(x, weight.t(), out_dtype=torch.float32, out=out)
    else:
        product = F.linear(x, weight).float()
    return product if out is None else out.copy_(product)


class LinearWeight(nn.Module):
    """One projection, or several fused along the output: `out_parts` are their output sizes, in the order of
    the checkpoint's tensors (q, k, v; gate, up)."""

    suffixes: tuple[str, ...] = ("weight",)  # its tensors per checkpoint projection

    def __init__(self, in_features: int, out_parts: tuple[int, ...]) -> None:
        super().__init__()
        self.in_features, self.out_parts = in_features, out_parts

    def part_rows(self, part: int) -> slice:
        """The output rows of the fused projection `part`."""
        start = sum(self.out_parts[:part])
        return slice(start, start + self.out_parts[part])

    def checkpoint_routes(self) -> Iterator[tuple[str, Route]]:
        """Its tensors when it is one checkpoint projection (a fused one is routed by its layer: part_routes)."""
        for suffix in self.suffixes:
            yield suffix, Route(self, suffix)

    def load_weight(self, suffix: str, tensor: torch.Tensor, part: int | None = None, expert: None = None) -> None:
        """A projection belongs to no expert (`expert` is the loaders' shared signature: Route.load)."""
        dest = getattr(self, suffix).data
        copy_checked(dest if part is None else dest[self.part_rows(part)], tensor)

    def matmul(self, x: torch.Tensor, *, dependents_early: bool = False, invariant: bool = False) -> torch.Tensor:
        """x [T, in] times the weight: [T, out], in x's dtype."""
        raise NotImplementedError

    def partials(self, x: torch.Tensor, *, preloaded: bool = False, invariant: bool = False) -> torch.Tensor:
        """The product as [S, T, out] partial sums, which the next norm adds (ops/norms.py)."""
        raise NotImplementedError

    def preloads(self, rows: int) -> bool:
        """Whether `partials(preloaded=True)` applies to `rows` rows: its weight tiles loaded before x is ready."""
        raise NotImplementedError

    def gated(self, x: torch.Tensor, *, invariant: bool = False) -> torch.Tensor:
        """silu(gate(x)) * up(x) [T, I] in x's dtype, this weight being gate and up fused."""
        raise NotImplementedError

    def gated_partials(self, down: LinearWeight, x: torch.Tensor, *, invariant: bool = False) -> torch.Tensor:
        """down(silu(gate(x)) * up(x)) as partial sums, this weight being gate and up fused: the two products in turn,
        where a format has no fused call for this pair (down in another format: modules_to_not_convert)."""
        return down.partials(self.gated(x, invariant=invariant), invariant=invariant)


class UnquantizedWeight(LinearWeight):
    """A 16- or 32-bit float weight [out, in], multiplied by ops/linear.py's kernels."""

    def __init__(self, in_features: int, out_parts: tuple[int, ...], build: LayerBuild) -> None:
        super().__init__(in_features, out_parts)
        self.weight = parameter(build, sum(out_parts), in_features)

    def matmul(self, x: torch.Tensor, *, dependents_early: bool = False, invariant: bool = False) -> torch.Tensor:
        return linear(x, self.weight, dependents_early=dependents_early, invariant=invariant)

    def partials(self, x: torch.Tensor, *, preloaded: bool = False, invariant: bool = False) -> torch.Tensor:
        if preloaded:
            return preloaded_partials(x, self.weight)
        return linear_partials(x, self.weight, invariant=invariant)

    def preloads(self, rows: int) -> bool:
        return preload_applies(rows, self.weight)

    def gated(self, x: torch.Tensor, *, invariant: bool = False) -> torch.Tensor:
        return gated_linear(x, self.weight, invariant=invariant)

    def gated_partials(self, down: LinearWeight, x: torch.Tensor, *, invariant: bool = False) -> torch.Tensor:
        """One call for both, so down's kernel can launch as gate/up's starts (ops/linear.py's mlp_partials)."""
        if not isinstance(down, UnquantizedWeight):
            return super().gated_partials(down, x, invariant=invariant)
        return mlp_partials(x, self.weight, down.weight, invariant)
