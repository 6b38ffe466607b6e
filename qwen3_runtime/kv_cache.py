"""Paged KV cache: one device tensor for all layers and a free list of fixed-size blocks."""

from __future__ import annotations

from collections import deque

import torch

from qwen3_runtime.config import ArchitectureConfig
from qwen3_runtime.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def allocate_kv_cache(
    arch: ArchitectureConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[layers, 2 (k, v), blocks, block_size, kv_heads, head_dim]."""
    return torch.empty(
        arch.num_hidden_layers,
        2,
        num_blocks,
        block_size,
        arch.num_key_value_heads,
        arch.head_dim,
        dtype=dtype,
        device=device,
    )


def kv_bytes_per_block(arch: ArchitectureConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty(0, dtype=dtype).element_size()
    return arch.num_hidden_layers * 2 * block_size * arch.num_key_value_heads * arch.head_dim * element


class BlockManager:
    """Hands out cache blocks to sequences; a sequence owns blocks for every token it has cached."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free: deque[int] = deque(range(num_blocks))

    def blocks_needed(self, seq: Sequence) -> int:
        """Blocks `seq` lacks to hold all its tokens (the next forward writes up to num_tokens)."""
        return max(0, cdiv(seq.num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence) -> bool:
        return self.blocks_needed(seq) <= len(self.free)

    def grow(self, seq: Sequence) -> None:
        for _ in range(self.blocks_needed(seq)):
            seq.block_table.append(self.free.popleft())

    def release(self, seq: Sequence) -> None:
        self.free.extend(seq.block_table)
        seq.block_table = []
