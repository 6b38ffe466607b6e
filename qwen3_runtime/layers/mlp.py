"""The dense feed-forward block. A feed-forward block's contract: forward(x [T, hidden], invariant) returns
[S, T, hidden] partial sums, which the next norm adds (ops/norms.py)."""

from __future__ import annotations

import torch
from torch import nn

from qwen3_runtime.ops.linear import mlp_partials


class DenseMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused into one projection."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """down_proj as [S, T, hidden] partial sums, like Attention's output."""
        return mlp_partials(x, self.gate_up_proj.weight, self.down_proj.weight, invariant)
