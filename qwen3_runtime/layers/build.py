"""What every layer is built with: one object that a weight format or a shard placement can join, reaching each
layer without a change to the model's code."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerBuild:
    dtype: torch.dtype  # of the parameters as they are created: nothing is cast after


def parameter(build: LayerBuild, *shape: int) -> torch.nn.Parameter:
    """An uninitialized parameter (on the current device: meta while the model is built)."""
    return torch.nn.Parameter(torch.empty(*shape, dtype=build.dtype))
