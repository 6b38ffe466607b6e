"""Attention over the paged KV cache, and what a forward tells it of where its tokens go."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.formats import projection
from qwen3_runtime.layers.loading import Route, part_routes, routes
from qwen3_runtime.layers.norm import RMSNorm
from qwen3_runtime.layers.rotary import Rotary
from qwen3_runtime.ops.attention_inputs import attention_inputs
from qwen3_runtime.ops.decode_attention import paged_decode_attention
from qwen3_runtime.ops.prefill_attention import PrefillPlan, attend_prefill

QKV = ("q_proj", "k_proj", "v_proj")  # the checkpoint's projections that qkv_proj fuses, in its order


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

    @functools.cached_property
    def real_rows(self) -> torch.Tensor:
        """[T] bool: the rows that are not padding, for the MoE layers' routing; computed once per forward (each
        forward, and each captured graph, builds its own metadata)."""
        return self.slot_mapping >= 0


class Attention(nn.Module):
    """Grouped-query attention with per-head q/k RMSNorm before the rotary embedding, over the paged KV cache."""

    def __init__(
        self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, build: LayerBuild
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = self.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = projection(build, hidden_size, dict(zip(QKV, (q_size, kv_size, kv_size))))
        self.o_proj = projection(build, q_size, {"o_proj": hidden_size})
        self.q_norm = RMSNorm(self.head_dim, eps, build)
        self.k_norm = RMSNorm(self.head_dim, eps, build)

    def checkpoint_routes(self) -> Iterator[tuple[str, Route]]:
        """The checkpoint's separate q, k and v projections are the three parts of qkv_proj."""
        for part, name in enumerate(QKV):
            yield from part_routes(self.qkv_proj, name, part)
        for name in ("o_proj", "q_norm", "k_norm"):
            yield from routes(getattr(self, name), f"{name}.")

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: Rotary, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The output projection as [S, T, hidden] partial sums (ops/linear.py), for the next norm to add."""
        k_cache, v_cache = kv_cache
        invariant = meta.batch_invariant
        # qkv lets the attention inputs launch as it starts (their one-warp programs fit beside it), so they
        # read their staged inputs, and attention (and o_proj's preload) launches, while qkv streams.
        qkv = self.qkv_proj.matmul(x, dependents_early=True, invariant=invariant)
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
        preload = not meta.is_prefill and self.o_proj.preloads(x.shape[0])
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
        return self.o_proj.partials(out, preloaded=preload, invariant=invariant)
