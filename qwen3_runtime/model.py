"""Qwen3 dense decoder over a paged KV cache (per-head q/k RMSNorm before RoPE, GQA)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from qwen3_runtime.config import ArchitectureConfig
from qwen3_runtime.models.qwen3_config import RopeScaling
from qwen3_runtime.ops.attention_inputs import attention_inputs
from qwen3_runtime.ops.decode_attention import paged_decode_attention
from qwen3_runtime.ops.embedding import embed
from qwen3_runtime.ops.invariant_linear import invariant_linear
from qwen3_runtime.ops.linear import linear, linear_partials, mlp_partials
from qwen3_runtime.ops.linear_preload import preload_applies, preloaded_partials
from qwen3_runtime.ops.norms import add_rms_norm
from qwen3_runtime.ops.prefill_attention import PrefillPlan, attend_prefill


@dataclass
class AttentionMetadata:
    """Where this forward's tokens go in the KV cache and what they attend to.

    Prefill: the new tokens of several sequences packed back to back, attending to the cache (`prefill`).
    Decode: one token per row; every tensor is a static device buffer (graph-capturable).
    """

    slot_mapping: torch.Tensor  # [T] cache slot of each token; -1 = padded row, not stored
    prefill: PrefillPlan | None = None  # prefill only: built once per forward (ops/prefill_attention.py)
    block_tables: torch.Tensor | None = None  # decode only: [B, max_blocks] int32
    seq_lens: torch.Tensor | None = None  # decode only: [B] int32, 0 for padded rows
    num_splits: int = 1  # decode only: split-KV partitions (static)
    split_arrivals: torch.Tensor | None = None  # decode only: [B, kv_heads] int32 zeros (ops/decode_attention.py)
    batch_invariant: bool = False  # every product by ops/invariant_linear.py (engine.batch_invariant)

    @property
    def is_prefill(self) -> bool:
        return self.prefill is not None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm(x), or with `residual`: residual += x in place, then RMSNorm(residual)."""
        return add_rms_norm(x, self.weight, self.eps, residual)


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


class Attention(nn.Module):
    def __init__(self, cfg: ArchitectureConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.scale = self.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: Rotary, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The output projection as [S, T, hidden] partial sums (ops/linear.py), for the next norm to add."""
        k_cache, v_cache = kv_cache
        invariant = meta.batch_invariant
        # qkv lets the attention inputs launch as it starts (their one-warp programs fit beside it), so they
        # read their staged inputs, and attention (and o_proj's preload) launches, while qkv streams.
        qkv = linear(x, self.qkv_proj.weight, dependents_early=True, invariant=invariant)
        q, k, v = attention_inputs(
            qkv,
            self.num_heads,
            self.num_kv_heads,
            self.q_norm.weight,
            self.k_norm.weight,
            self.q_norm.eps,
            rotary.cos_sin,
            positions,
            k_cache,
            v_cache,
            meta.slot_mapping,
            invariant=invariant,
        )
        preload = not meta.is_prefill and preload_applies(x.shape[0], self.o_proj.weight)
        if meta.is_prefill:
            out = attend_prefill(q, k, v, k_cache, v_cache, meta.prefill, self.scale, invariant)
        else:
            out = paged_decode_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                self.scale,
                meta.num_splits,
                dependents_early=preload,
                arrivals=meta.split_arrivals,
            )
        out = out.reshape(x.shape[0], -1)
        if preload:
            return preloaded_partials(out, self.o_proj.weight)
        return linear_partials(out, self.o_proj.weight, invariant=invariant)


class MLP(nn.Module):
    def __init__(self, cfg: ArchitectureConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """down_proj as [S, T, hidden] partial sums, like Attention's output."""
        return mlp_partials(x, self.gate_up_proj.weight, self.down_proj.weight, invariant)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchitectureConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

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
        return self.mlp(x, invariant=meta.batch_invariant), residual


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ArchitectureConfig) -> None:
        super().__init__()
        # Given its weight, the embedding skips its init: normal_ imports torch._dynamo (seconds at start-up).
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


class Qwen3ForCausalLM(nn.Module):
    """Module names follow Hugging Face's, except the fused qkv_proj and gate_up_proj."""

    def __init__(self, cfg: ArchitectureConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

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
        head_dim]. fed_from = (prev_row, sampled): a row with prev_row >= 0 takes as its input the token
        sampled[prev_row] by the step still in flight (async scheduling; ops/embedding.py)."""
        x = embed(self.model.embed_tokens.weight, input_ids, *(fed_from or (None, None)))
        residual = None
        for layer, layer_cache in zip(self.model.layers, kv_cache):
            x, residual = layer(x, residual, positions, self.model.rotary, layer_cache, meta)
        return self.model.norm(x, residual)

    def compute_logits(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None, invariant: bool = False
    ) -> torch.Tensor:
        """fp32 logits (into `out` when given). On the GPU the bf16 operands accumulate in fp32 and the product
        is written in fp32 directly: rounded to bf16, a logit of 20 would only be good to +-0.06. invariant: by
        the batch-invariant kernel (engine.batch_invariant)."""
        weight = self.lm_head.weight
        if invariant:
            logits = invariant_linear(hidden, weight, out_dtype=torch.float32)
        elif hidden.is_cuda and hidden.dtype != torch.float32:
            if out is None:
                return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
            return torch.mm(hidden, weight.t(), out_dtype=torch.float32, out=out)
        else:
            logits = F.linear(hidden, weight).float()
        return logits if out is None else out.copy_(logits)
