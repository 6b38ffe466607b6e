import math

import torch


class PagedCache:
    """Sequences' K/V unpaged (`dense_k`, `dense_v`: [seq_len, kv_heads, head_dim] each) and in a paged cache of
    shuffled blocks (`tables[i]`: sequence i's block ids). Unused cache slots are NaN, so any read of them shows."""

    def __init__(self, seq_lens, block_size, num_kv_heads, head_dim, generator, dtype=torch.float32, device="cpu"):
        blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + 3
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.tables, self.dense_k, self.dense_v = [], [], []
        free_blocks = torch.randperm(num_blocks, generator=generator).tolist()
        for seq_len, num in zip(seq_lens, blocks_per_seq):
            blocks = torch.tensor([free_blocks.pop() for _ in range(num)], dtype=torch.long)
            self.tables.append(blocks.tolist())
            positions = torch.arange(seq_len)
            slot_blocks, slot_offsets = blocks[positions // block_size].to(device), (positions % block_size).to(device)
            for dense, cache in ((self.dense_k, self.k_cache), (self.dense_v, self.v_cache)):
                rows = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator).to(dtype).to(device)
                cache[slot_blocks, slot_offsets] = rows
                dense.append(rows)
