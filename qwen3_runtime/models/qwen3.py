"""The dense Qwen3 family: decoder layers of layers/ over a paged KV cache (per-head q/k RMSNorm before RoPE, GQA)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from qwen3_runtime.layers.attention import Attention, AttentionMetadata
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.mlp import DenseMLP
from qwen3_runtime.layers.norm import RMSNorm
from qwen3_runtime.layers.rotary import Rotary
from qwen3_runtime.layers.vocab import LMHead, VocabEmbedding
from qwen3_runtime.models.qwen3_config import Qwen3Config


class Qwen3DecoderLayer(nn.Module):
    """Attention, then the feed-forward block `mlp` (the layer's family chooses it: Qwen3Model.feed_forward)."""

    def __init__(self, cfg: Qwen3Config, build: LayerBuild, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build)
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            build.at("self_attn"),
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build)
        self.mlp = mlp

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: Rotary,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output as partial sums (or, with residual None, the embeddings).
        Each residual add is fused into the norm after it, so the layer returns its MLP output unadded,
        with the residual stream it is to be added to (in place, by the next norm)."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, rotary, kv_cache, meta)
        x = self.post_attention_layernorm(x, residual)
        return self.mlp(x, meta), residual


class Qwen3Model(nn.Module):
    def __init__(self, cfg: Qwen3Config, build: LayerBuild) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, build)
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(cfg, build.at(f"layers.{i}"), self.feed_forward(cfg, build.at(f"layers.{i}.mlp"), i))
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    @staticmethod
    def feed_forward(cfg: Qwen3Config, build: LayerBuild, index: int) -> nn.Module:
        """Layer `index`'s feed-forward block (`build` at its checkpoint name): the family's seam (Qwen3-MoE's differs
        by layer)."""
        return DenseMLP(cfg.hidden_size, cfg.intermediate_size, build)


class Qwen3ForCausalLM(nn.Module):
    """Module names follow Hugging Face's, except the fused qkv_proj and gate_up_proj."""

    model_cls: ClassVar[type[Qwen3Model]] = Qwen3Model  # the decoder stack, which a family may extend

    def __init__(self, cfg: Qwen3Config, build: LayerBuild) -> None:
        super().__init__()
        self.config = cfg
        self.model = self.model_cls(cfg, build.at("model"))
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, build)

    def tie_lm_head(self) -> None:
        self.lm_head.tie_to(self.model.embed_tokens)

    def after_load(self, seen: set[str]) -> set[str]:
        """The tensors it accounts for beyond those loaded (`seen`). Tied checkpoints omit lm_head, or (Qwen3-0.6B,
        1.7B) hold a copy of the embedding: tie rather than keep a second vocab x hidden tensor, as transformers and
        vLLM do. A different lm_head stays, as transformers keeps it."""
        if self.config.tie_word_embeddings and (
            "lm_head.weight" not in seen or torch.equal(self.lm_head.weight, self.model.embed_tokens.weight)
        ):
            self.tie_lm_head()
            return {"lm_head.weight"}
        return set()

    @property
    def lm_head_is_tied(self) -> bool:
        return self.lm_head.weight is self.model.embed_tokens.weight

    def build_rope_table(self, max_len: int) -> None:
        """RoPE's cos/sin for positions [0, max_len), on the model's device."""
        self.model.rotary.build_table(max_len, self.lm_head.weight.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        fed_from: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [T, hidden]; `kv_cache` is [layers, 2, blocks, block_size, kv_heads,
        head_dim]; fed_from as VocabEmbedding.embed's."""
        x = self.model.embed_tokens.embed(input_ids, fed_from)
        residual = None
        for layer, layer_cache in zip(self.model.layers, kv_cache):
            x, residual = layer(x, residual, positions, self.model.rotary, layer_cache, meta)
        return self.model.norm(x, residual)

    def compute_logits(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None, invariant: bool = False
    ) -> torch.Tensor:
        """fp32 logits (LMHead.logits); kept on the model, where the runner (and tests) look it up on each call."""
        return self.lm_head.logits(hidden, out, invariant)
