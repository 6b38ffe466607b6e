"""Order keys in PyTorch (ops/logprob_reduce.order_key on the device): a unique int64 key per token whose descending
order is the stable descending sort's of the values (value, then the lower id), so that the k largest keys are an
exact top-k whatever the ties (`top_ids`), and a count of the keys above a token's is its rank, without a sort."""

from __future__ import annotations

import torch


def order_keys_reference(values: torch.Tensor) -> torch.Tensor:
    """[B, V] int64 keys of fp32 values [B, V] (token ids 0..V-1)."""
    token = torch.arange(values.shape[-1], device=values.device, dtype=torch.int64)
    return order_key(values, token)


def order_key(values: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Keys of fp32 values at token ids `token` (broadcast to the values' shape): the value's order-preserving bits
    (negatives' magnitudes flipped; -0.0 taken as 0.0, which the sort takes as equal) over the complemented token
    id. In place after the first steps: on the CPU a fresh [B, V] tensor a step costs more than its arithmetic."""
    bits = (values + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes 0.0
    ordered = (bits >> 31).bitwise_and_(0x7FFFFFFF).bitwise_xor_(bits)  # as int32, in the floats' order
    return ordered.long().bitwise_left_shift_(32).bitwise_or_(0x7FFFFFFF - token)


def top_ids(x: torch.Tensor, k: int, block: int = 128) -> torch.Tensor:
    """[k] int64: the ids of the k (1 <= k <= V) largest of fp32 values x [V] (no NaN), value descending then the
    lower id (the stable sort's first k), in O(V) as the device kernels select them: they are all at least the
    k-th largest maximum of blocks of `block` values (k blocks hold one that large), so only the blocks whose
    maximum reaches it hold candidates, ranked by their order keys."""
    vocab = x.numel()
    whole = vocab - vocab % block
    maxima = x[:whole].view(-1, block).amax(1)
    if whole < vocab:  # the last block, partial
        maxima = torch.cat([maxima, x[whole:].amax(0, keepdim=True)])
    floor = maxima.topk(min(k, len(maxima))).values[-1]  # with fewer than k blocks, every block is a candidate
    blocks = (maxima >= floor).nonzero()[:, 0]
    ids = (blocks[:, None] * block + torch.arange(block, device=x.device)).flatten()
    if whole < vocab:
        ids = ids[ids < vocab]
    return ids[order_key(x[ids], ids).topk(k).indices]
