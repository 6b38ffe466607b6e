"""Which KV cache blocks each sequence owns: a free list of fixed-size blocks."""

from __future__ import annotations

from collections import deque

from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import Request


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
