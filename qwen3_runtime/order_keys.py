"""Order keys in PyTorch (logprobs/kernels.order_key on the device): a unique int64 key per token whose descending
order is the stable descending sort's of the values (value, then the lower id), so that the k largest keys are an
exact top-k whatever the ties, and a count of the keys above a token's is its rank, without a sort."""

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
