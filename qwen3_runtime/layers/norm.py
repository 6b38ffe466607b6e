"""RMSNorm, with the residual add fused in (ops/norms.py)."""

from __future__ import annotations

import torch
from torch import nn

from qwen3_runtime.layers.build import LayerBuild, parameter
from qwen3_runtime.ops.norms import add_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, build: LayerBuild) -> None:
        super().__init__()
        self.eps = eps
        self.weight = parameter(build, dim)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm(x), or with `residual`: residual += x in place, then RMSNorm(residual)."""
        return add_rms_norm(x, self.weight, self.eps, residual)
