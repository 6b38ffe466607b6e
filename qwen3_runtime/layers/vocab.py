"""The vocabulary's two ends: token ids into hidden states, hidden states into fp32 logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qwen3_runtime.layers.build import LayerBuild, parameter
from qwen3_runtime.ops.embedding import embed
from qwen3_runtime.ops.invariant_linear import invariant_linear


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
        """fp32 logits (into `out` when given). On the GPU the bf16 operands accumulate in fp32 and the product
        is written in fp32 directly: rounded to bf16, a logit of 20 would only be good to +-0.06. invariant: by
        the batch-invariant kernel (engine.batch_invariant)."""
        weight = self.weight
        if invariant:
            logits = invariant_linear(hidden, weight, out_dtype=torch.float32)
        elif hidden.is_cuda and hidden.dtype != torch.float32:
            if out is None:
                return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
            return torch.mm(hidden, weight.t(), out_dtype=torch.float32, out=out)
        else:
            logits = F.linear(hidden, weight).float()
        return logits if out is None else out.copy_(logits)
