"""Paged KV cache: one device tensor for all layers and a free list of fixed-size blocks."""

from __future__ import annotations

from collections import deque

import torch

from qwen3_runtime.config import ArchitectureConfig
from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import Request


def cache_slot(block_table, position, block_size: int):
    """The cache slot of a token position: a list and an int, or a NumPy table and positions array."""
    return block_table[position // block_size] * block_size + position % block_size


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
        self.num_blocks = num_blocks
        self.free: deque[int] = deque(range(num_blocks))

    def blocks_needed(self, req: Request) -> int:
        """Blocks `req` lacks to hold all its tokens (the next forward writes up to num_tokens)."""
        return max(0, cdiv(req.num_tokens, self.block_size) - len(req.block_table))

    def can_grow(self, req: Request) -> bool:
        return self.blocks_needed(req) <= len(self.free)

    def grow(self, req: Request) -> None:
        for _ in range(self.blocks_needed(req)):
            req.block_table.append(self.free.popleft())

    def release(self, req: Request) -> None:
        self.free.extend(req.block_table)
        req.block_table = []
