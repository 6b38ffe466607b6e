"""Routing tokens to experts: softmax over the router's fp32 logits, the top k (ties to the lower expert id),
renormalised to sum to 1 when the model says so. The logits may come as [S, T, E] partial sums over slices of the
hidden size (ops/linear.py's skinny kernel, which at decode sizes reads the router's weight faster than cuBLAS):
added here, in fp32, before the softmax. Padded rows route nowhere: expert id E (one past the last), weight
0, so the expert kernels read no weight for them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import pdl_launch, use_triton

# Bits of an order key that hold the expert id (below the probability's bits): fewer experts than 2**ID_BITS.
ID_BITS, ID_MASK = tl.constexpr(16), tl.constexpr(0xFFFF)


@triton.jit
def _route_kernel(
    logits_ptr,
    valid_ptr,
    ids_ptr,
    weights_ptr,
    num_experts,
    stride_part,
    stride_row,
    NUM_PARTS: tl.constexpr,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program per row. Each expert's order key is its probability's bits (non-negative floats order as their
    bits) above the complement of its id, so one max picks the largest probability and, among equal ones, the
    lower id; a picked key drops to -1. The k picks are distinct ids below E whatever the logits (NaN too)."""
    if USE_PDL:  # the router's logits come from the previous kernel
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    in_row = experts < num_experts
    logits = tl.zeros([BLOCK_E], tl.float32)
    for part in tl.static_range(NUM_PARTS):
        offs = part * stride_part + row * stride_row + experts
        logits += tl.load(logits_ptr + offs, mask=in_row, other=float("-inf")).to(tl.float32)
    exps = tl.exp(logits - tl.max(logits, axis=0))
    probs = exps / tl.sum(tl.where(in_row, exps, 0.0), axis=0)
    bits = probs.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    keys = tl.where(in_row, (bits << ID_BITS) | (experts ^ ID_MASK), -1)
    slots = tl.arange(0, BLOCK_K)
    picked_ids = tl.zeros([BLOCK_K], tl.int32)
    picked = tl.zeros([BLOCK_K], tl.float32)
    for slot in range(TOP_K):
        best = tl.max(keys, axis=0)
        expert = ((best & ID_MASK) ^ ID_MASK).to(tl.int32)
        prob = (best >> ID_BITS).to(tl.int32).to(tl.float32, bitcast=True)
        picked_ids = tl.where(slots == slot, expert, picked_ids)
        picked = tl.where(slots == slot, prob, picked)
        keys = tl.where(experts == expert, -1, keys)
    if RENORMALIZE:
        picked = picked / tl.sum(picked, axis=0)
    valid = tl.load(valid_ptr + row) != 0
    out = row * TOP_K + slots
    tl.store(ids_ptr + out, tl.where(valid, picked_ids, num_experts), mask=slots < TOP_K)
    tl.store(weights_ptr + out, tl.where(valid, picked, 0.0), mask=slots < TOP_K)
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()


def route(
    router_logits: torch.Tensor, valid: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] fp32 (bf16 or fp16 are taken in fp32), or [S, T, E] partial sums of them; valid [T] bool
    (False: a padded row) -> expert ids [T, k] int32 (E where not valid) and their weights [T, k] fp32 (0 where not
    valid), each row's in descending weight."""
    if not use_triton(router_logits):
        return route_reference(router_logits, valid, top_k, renormalize)
    parts = router_logits if router_logits.dim() == 3 else router_logits[None]
    tokens, num_experts = parts.shape[1:]
    assert parts.is_floating_point() and parts.stride(2) == 1 and valid.dtype == torch.bool
    assert 0 < top_k <= num_experts <= ID_MASK.value and valid.shape == (tokens,)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=router_logits.device)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=router_logits.device)
    block_e = triton.next_power_of_2(num_experts)
    if tokens:
        _route_kernel[(tokens,)](
            parts,
            valid,
            ids,
            weights,
            num_experts,
            parts.stride(0),
            parts.stride(1),
            NUM_PARTS=parts.shape[0],
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            BLOCK_E=block_e,
            BLOCK_K=triton.next_power_of_2(top_k),
            num_warps=max(1, min(4, block_e // 256)),  # a row a program, latency-bound: small programs
            **pdl_launch(router_logits),
        )
    return ids, weights


def route_reference(
    router_logits: torch.Tensor, valid: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if router_logits.dim() == 3:
        router_logits = router_logits.sum(0, dtype=torch.float32)
    num_experts = router_logits.shape[1]
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = probs.sort(dim=-1, descending=True, stable=True)  # stable: ties keep the lower id first
    weights, ids = weights[:, :top_k], ids[:, :top_k].to(torch.int32)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    ids = ids.masked_fill(~valid[:, None], num_experts)
    return ids, weights.masked_fill(~valid[:, None], 0.0)
