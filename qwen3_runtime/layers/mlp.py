"""The dense feed-forward block. A feed-forward block's contract: forward(x [T, hidden], meta) returns
[S, T, hidden] partial sums, which the next norm adds (ops/norms.py); meta is the forward's AttentionMetadata (the
batch-invariant mode, and which rows are padding)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from qwen3_runtime.layers.attention import AttentionMetadata
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.formats import projection
from qwen3_runtime.layers.loading import Route, part_routes, routes

GATE_UP = ("gate_proj", "up_proj")  # the checkpoint's projections that gate_up_proj fuses, in its order


class DenseMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused into one projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, build: LayerBuild) -> None:
        super().__init__()
        self.gate_up_proj = projection(build, hidden_size, dict.fromkeys(GATE_UP, intermediate_size))
        self.down_proj = projection(build, intermediate_size, {"down_proj": hidden_size})

    def checkpoint_routes(self) -> Iterator[tuple[str, Route]]:
        """The checkpoint's gate and up projections are the two parts of gate_up_proj."""
        for part, name in enumerate(GATE_UP):
            yield from part_routes(self.gate_up_proj, name, part)
        yield from routes(self.down_proj, "down_proj.")

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """down_proj as [S, T, hidden] partial sums, like Attention's output."""
        return self.gate_up_proj.gated_partials(self.down_proj, x, invariant=meta.batch_invariant)
