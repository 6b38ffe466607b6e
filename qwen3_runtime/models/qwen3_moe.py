"""The Qwen3-MoE family (Qwen3-30B-A3B, Qwen3-235B-A22B): the dense family's decoder with a sparse MoE block as the
feed-forward of the layers its config makes sparse; names and loading as transformers' Qwen3MoeForCausalLM."""

from __future__ import annotations

from torch import nn

from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.moe import SparseMoeBlock
from qwen3_runtime.models.qwen3 import Qwen3ForCausalLM, Qwen3Model
from qwen3_runtime.models.qwen3_moe_config import Qwen3MoeConfig


class Qwen3MoeModel(Qwen3Model):
    @staticmethod
    def feed_forward(cfg: Qwen3MoeConfig, build: LayerBuild, index: int) -> nn.Module:
        if not cfg.is_sparse_layer(index):
            return Qwen3Model.feed_forward(cfg, build, index)
        return SparseMoeBlock(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
            build,
        )


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    model_cls = Qwen3MoeModel
