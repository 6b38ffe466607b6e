"""Routing tokens to experts: softmax over the router's fp32 logits, the top k (ties to the lower expert id),
renormalised to sum to 1 when the model says so. Padded rows route nowhere: expert id E (one past the last), weight
0, so the expert kernels read no weight for them."""

from __future__ import annotations

import torch


def route(
    router_logits: torch.Tensor, valid: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] fp32, valid [T] bool (False: a padded row) -> expert ids [T, k] int32 (E where not
    valid) and their weights [T, k] fp32 (0 where not valid), each row's in descending weight."""
    return route_reference(router_logits, valid, top_k, renormalize)


def route_reference(
    router_logits: torch.Tensor, valid: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    num_experts = router_logits.shape[1]
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = probs.sort(dim=-1, descending=True, stable=True)  # stable: ties keep the lower id first
    weights, ids = weights[:, :top_k], ids[:, :top_k].to(torch.int32)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    ids = ids.masked_fill(~valid[:, None], num_experts)
    return ids, weights.masked_fill(~valid[:, None], 0.0)
