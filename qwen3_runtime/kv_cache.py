"""Paged KV cache: one device tensor for all layers, cut into fixed-size blocks (block_manager.py hands them out)."""

from __future__ import annotations

import torch

from qwen3_runtime.config import ArchitectureConfig


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
