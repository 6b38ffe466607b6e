"""The rotary position embedding's table, with YaRN's frequencies for contexts past the trained one."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # layers sit below models: the type alone
    from qwen3_runtime.models.qwen3_config import RopeScaling


class Rotary(nn.Module):
    """The half-split (NeoX) rotary embedding's cos/sin table over all positions (applied by attention_inputs)."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None) -> None:
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build_table(self, max_len: int, device: torch.device) -> None:
        inv_freq, scale = rope_frequencies(self.head_dim, self.theta, self.scaling)
        freqs = torch.arange(max_len, device=device).float()[:, None] * inv_freq.to(device)[None, :]
        self.cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1) * scale


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> tuple[torch.Tensor, float]:
    """The inverse frequencies of the head's dimension pairs and the factor on cos and sin. YaRN divides the
    frequencies too slow to have turned often over the original context by `factor` (interpolating positions past
    it) and keeps the fast ones, ramping linearly between, as transformers' and vLLM's YaRN."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is None:
        return inv_freq, 1.0

    def dimension_turning(turns: float) -> float:  # the pair whose frequency turns `turns` times in the context
        return (
            head_dim
            * math.log(scaling.original_max_position_embeddings / (turns * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = dimension_turning(scaling.beta_fast), dimension_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high += 0.001 if high == low else 0
    ramp = ((torch.arange(head_dim // 2).float() - low) / (high - low)).clamp(0, 1)  # 1: interpolated
    inv_freq = inv_freq * (1 - ramp) + inv_freq / scaling.factor * ramp
    scale = scaling.attention_factor
    if scale is None:
        scale = 0.1 * math.log(scaling.factor) + 1.0
    return inv_freq, scale
