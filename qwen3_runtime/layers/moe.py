"""The sparse mixture-of-experts feed-forward block (Qwen3-MoE): a router picks each token's top-k experts, whose
SwiGLU outputs, weighted, are the block's partial sums (the feed-forward contract of layers/mlp.py)."""

from __future__ import annotations

import torch
from torch import nn

from qwen3_runtime.layers.attention import AttentionMetadata
from qwen3_runtime.layers.build import LayerBuild, parameter
from qwen3_runtime.layers.formats import experts
from qwen3_runtime.layers.linear import fp32_product
from qwen3_runtime.ops.linear import skinny_fp32_partials
from qwen3_runtime.ops.moe_routing import route


class Router(nn.Module):
    """The router's [experts, hidden] weight: a plain parameter, never quantized (a weight format does not reach it),
    since its logits, in fp32, decide which experts run."""

    def __init__(self, hidden_size: int, num_experts: int, build: LayerBuild) -> None:
        super().__init__()
        self.weight = parameter(build, num_experts, hidden_size)

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """fp32 router logits [T, experts], or [S, T, experts] partial sums of them, which routing adds."""
        parts = None if invariant else skinny_fp32_partials(x, self.weight)
        return fp32_product(x, self.weight, invariant=invariant) if parts is None else parts


class SparseMoeBlock(nn.Module):
    """Each token through its top-k experts by the router's softmax (ties to the lower expert id), their weights
    renormalised to sum to 1 when `renormalize` (norm_topk_prob); padded rows route to no expert."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        build: LayerBuild,
    ) -> None:
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize
        self.gate = Router(hidden_size, num_experts, build)
        self.experts = experts(build.at("experts"), num_experts, hidden_size, intermediate_size)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        invariant = meta.batch_invariant
        expert_ids, weights = route(self.gate(x, invariant), meta.real_rows, self.top_k, self.renormalize)
        return self.experts.partials(x, expert_ids, weights, invariant)
