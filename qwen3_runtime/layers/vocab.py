"""The vocabulary's two ends: token ids into hidden states, hidden states into fp32 logits."""

from __future__ import annotations

import torch
from torch import nn

from qwen3_runtime.layers.build import LayerBuild, parameter
from qwen3_runtime.layers.linear import fp32_product
from qwen3_runtime.ops.embedding import embed


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, build: LayerBuild) -> None:
        super().__init__()
        self.weight = parameter(build, vocab_size, hidden_size)

    def embed(self, input_ids: torch.Tensor, fed_from: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """fed_from = (prev_row, sampled): a row with prev_row >= 0 takes as its input the token sampled[prev_row]
        by the step still in flight (async scheduling; ops/embedding.py)."""
        return embed(self.weight, input_ids, *(fed_from or (None, None)))


class LMHead(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, build: LayerBuild) -> None:
        super().__init__()
        self.weight = parameter(build, vocab_size, hidden_size)

    def tie_to(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight

    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None, invariant: bool = False) -> torch.Tensor:
        """fp32 logits (into `out` when given), from 16-bit operands accumulated in fp32 (fp32_product)."""
        return fp32_product(hidden, self.weight, out, invariant)
