"""The experts of a mixture-of-experts layer: each routed (token, slot) pair through its expert's SwiGLU,
down(silu(gate(x)) * up(x)), times its routing weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    invariant: bool = False,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; expert_ids [T, k] int32 and weights
    [T, k] fp32 (moe_routing.route). Returns [k, T, H] fp32 partial sums, slot s of token t being its s-th expert's
    weighted output, for the next norm to add (ops/norms.py); a pair routed to expert E (a padded row) is 0."""
    return fused_moe_reference(x, w13, w2, expert_ids, weights)


def fused_moe_reference(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """In fp32, rounding as the kernels do: gate and up to x's dtype, silu(gate) * up to x's dtype."""
    num_experts, inter = w13.shape[0], w2.shape[2]
    out = torch.zeros(expert_ids.shape[1], x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for expert in expert_ids.unique().tolist():
        if expert == num_experts:
            continue
        tokens, slots = (expert_ids == expert).nonzero(as_tuple=True)
        gate_up = (x[tokens].float() @ w13[expert].float().t()).to(x.dtype).float()
        act = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]).to(x.dtype).float()
        out[slots, tokens] = (act @ w2[expert].float().t()) * weights[tokens, slots, None]
    return out
