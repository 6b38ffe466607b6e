"""The experts of a mixture-of-experts layer: each routed (token, slot) pair through its expert's SwiGLU,
down(silu(gate(x)) * up(x)), times its routing weight.

Two grouped-GEMM kernels (ops/fused_moe_kernels.py): gate/up with silu * up in its epilogue writes act [T k, I] in
x's dtype; down writes each pair's weighted output to its slot of [k, T, H] fp32, whose sum over the slots the next
residual add + RMSNorm takes (`add_rms_norm`), so nothing here adds across experts and nothing uses atomics. The way a
program finds its rows and the tiles come from ops/moe_config.py, by the call's static sizes, so a captured graph
always runs the same kernels.

Block-FP8 experts (Qwen's FP8 checkpoints): w13 and w2 float8_e4m3fn with fp32 scales per expert, 128-row block and
128-column block (`w13_scale` [E, 2I / 128, ceil(H / 128)], `w2_scale` [E, ceil(H / 128), ceil(I / 128)]), applied
weight-only: the kernels convert each weight tile in registers and scale each K-tile's product (K-tiles must divide
128, so none straddles two blocks; I a multiple of 128, so no block holds gate and up rows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from qwen3_runtime.ops import pdl_launch, use_triton
from qwen3_runtime.ops.fp8_linear import dequantize_blocks
from qwen3_runtime.ops.fused_moe_kernels import down_kernel, gate_up_kernel
from qwen3_runtime.ops.linear import SCALE_BLOCK
from qwen3_runtime.ops.moe_config import MoeConfig, lookup

# Scan programs compare BLOCK_M wanted rows (or every expert) with this many routing entries at a time.
SCAN_COMPARES = 2048


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    invariant: bool = False,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; expert_ids [T, k] int32 and weights
    [T, k] fp32 (moe_routing.route). Returns [k, T, H] fp32 partial sums, slot s of token t being its s-th expert's
    weighted output, for the next norm to add (ops/norms.py); a pair routed to expert E (a padded row) is 0.
    invariant (engine.batch_invariant): one path and tile shape at every T, so a token's bits do not depend on the
    call's other tokens. w13_scale, w2_scale: the block scales of FP8 experts (both or neither)."""
    if not use_triton(x):
        return fused_moe_reference(x, w13, w2, expert_ids, weights, w13_scale, w2_scale)
    tokens, top_k = expert_ids.shape
    configs = lookup(w13, tokens, top_k, invariant), lookup(w2, tokens, top_k, invariant)
    return fused_moe_with(x, w13, w2, expert_ids, weights, *configs, w13_scale=w13_scale, w2_scale=w2_scale)


def fused_moe_with(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up_config: MoeConfig,
    down_config: MoeConfig,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """fused_moe with each kernel's configuration given (tests, scripts/tune_moe.py)."""
    (tokens, hidden), (num_experts, inter) = x.shape, (w2.shape[0], w2.shape[2])
    top_k = expert_ids.shape[1]
    assert w13.shape == (num_experts, 2 * inter, hidden) and w2.shape == (num_experts, hidden, inter)
    assert expert_ids.dtype == torch.int32 and weights.dtype == torch.float32
    if w13_scale is None and w2_scale is None:
        assert x.dtype == w13.dtype == w2.dtype
    else:
        assert w13.dtype == w2.dtype == torch.float8_e4m3fn and inter % SCALE_BLOCK == 0
        assert w13_scale.shape == (num_experts, 2 * inter // SCALE_BLOCK, triton.cdiv(hidden, SCALE_BLOCK))
        assert w2_scale.shape == (num_experts, triton.cdiv(hidden, SCALE_BLOCK), inter // SCALE_BLOCK)
        assert w13_scale.dtype == w2_scale.dtype == torch.float32 and w13_scale.stride(2) == w2_scale.stride(2) == 1
        assert SCALE_BLOCK % gate_up_config.block_k == 0 and SCALE_BLOCK % down_config.block_k == 0
    assert x.stride(1) == w13.stride(2) == w2.stride(2) == 1 and expert_ids.is_contiguous() and weights.is_contiguous()
    act = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    out = torch.empty(top_k, tokens, hidden, dtype=torch.float32, device=x.device)
    if tokens:
        groupings: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        gate_up(x, w13, expert_ids, act, gate_up_config, groupings, w13_scale)
        down(act, w2, expert_ids, weights, out, down_config, groupings, w2_scale)
    return out


def gate_up(
    x: torch.Tensor,
    w13: torch.Tensor,
    expert_ids: torch.Tensor,
    act: torch.Tensor,
    config: MoeConfig,
    groupings: dict[int, tuple[torch.Tensor, torch.Tensor]],
    scale: torch.Tensor | None = None,
) -> None:
    """act[p] = silu(gate) * up of pair p's expert on its token's x (pairs of expert E: unwritten)."""
    num_experts, n, k = w13.shape
    grid, args, order, table, num_blocks = _rows(expert_ids, num_experts, n, config, groupings)
    gate_up_kernel[grid](
        x, w13, scale, expert_ids, order, table, act,
        expert_ids.numel(), num_experts, expert_ids.shape[1], n // 2, k, num_blocks,
        x.stride(0), w13.stride(0), w13.stride(1), *_scale_strides(scale), act.stride(0),
        **args, **_tiles(config, k, x, scale), **pdl_launch(x),
    )  # fmt: skip


def down(
    act: torch.Tensor,
    w2: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
    config: MoeConfig,
    groupings: dict[int, tuple[torch.Tensor, torch.Tensor]],
    scale: torch.Tensor | None = None,
) -> None:
    """out[s, t] = weights[t, s] * (act[t k + s] @ w2[expert]^T), 0 for expert E."""
    num_experts, n, k = w2.shape
    grid, args, order, table, num_blocks = _rows(expert_ids, num_experts, n, config, groupings)
    down_kernel[grid](
        act, w2, scale, expert_ids, weights, order, table, out,
        expert_ids.numel(), num_experts, expert_ids.shape[1], n, k, num_blocks,
        act.stride(0), w2.stride(0), w2.stride(1), *_scale_strides(scale), out.stride(0),
        **args, **_tiles(config, k, act, scale), **pdl_launch(act),
    )  # fmt: skip


def _scale_strides(scale: torch.Tensor | None) -> tuple[int | None, int | None]:
    """An FP8 expert's scale strides (expert, row block); None for 16-bit experts, whose kernels compile as before."""
    return (None, None) if scale is None else (scale.stride(0), scale.stride(1))


def _tiles(config: MoeConfig, k: int, a: torch.Tensor, scale: torch.Tensor | None = None) -> dict:
    return dict(
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        SCALE_BLOCK=0 if scale is None else SCALE_BLOCK,
        EVEN_K=k % config.block_k == 0,
        UPCAST=not a.is_cuda and a.dtype != torch.float32,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def _rows(
    expert_ids: torch.Tensor,
    num_experts: int,
    n: int,
    config: MoeConfig,
    groupings: dict[int, tuple[torch.Tensor, torch.Tensor]],
) -> tuple[tuple[int, ...], dict, torch.Tensor, torch.Tensor, int]:
    """A launch's grid, its row-finding constants, and the sorted path's pair order and block table (the routing
    table itself on the scan path, which reads neither)."""
    pairs = expert_ids.numel()
    block_e = triton.next_power_of_2(num_experts)
    args = dict(
        SORTED=config.sorted,
        COMPACT=pairs < num_experts,
        CHUNK=max(16, SCAN_COMPARES // config.block_m),
        BLOCK_E=block_e,
        CHUNK_E=max(16, SCAN_COMPARES // block_e),
    )
    tiles_n = triton.cdiv(n, config.block_n)
    if not config.sorted:  # a group per expert with pairs (at most one per pair) and one for padded rows' pairs
        return (min(pairs, num_experts) + 1, tiles_n), args, expert_ids, expert_ids, 0
    if config.block_m not in groupings:
        groupings[config.block_m] = group_by_expert(expert_ids.view(-1), num_experts, config.block_m)
    order, table = groupings[config.block_m]
    num_blocks = table.shape[1]
    return (num_blocks * tiles_n,), args, order, table, num_blocks


def group_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs sorted by expert (E: padded rows' pairs, last), each expert's run cut into blocks of block_m: the pair
    order [P] and a table [3, blocks] of each block's expert (E + 1 past the used blocks), first and end positions in
    that order. Static shapes and no host sync, for CUDA graphs: blocks = cdiv(P, block_m) + min(E + 1, P) bounds the
    blocks used (each expert's run adds at most one partial block)."""
    pairs = ids.numel()
    num_blocks = triton.cdiv(pairs, block_m) + min(num_experts + 1, pairs)
    sorted_ids, order = torch.sort(ids, stable=True)
    # Expert e's pairs sit at edges[e] .. edges[e + 1] of the order.
    edges = torch.searchsorted(sorted_ids, torch.arange(num_experts + 2, dtype=ids.dtype, device=ids.device))
    blocks = (edges.diff() + block_m - 1) // block_m
    ends = blocks.cumsum(0)
    block = torch.arange(num_blocks, device=ids.device)
    expert = torch.searchsorted(ends, block, right=True)
    used = expert.clamp(max=num_experts)
    first = edges[used] + (block - ends[used] + blocks[used]) * block_m
    return order.to(torch.int32), torch.stack([expert, first, edges[used + 1]]).to(torch.int32)


def fused_moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """In fp32, rounding as the kernels do: gate and up to x's dtype, silu(gate) * up to x's dtype. FP8 experts
    (with their scales): of the dequantized weights."""
    if w13_scale is not None or w2_scale is not None:
        w13, w2 = dequantize_blocks(w13, w13_scale), dequantize_blocks(w2, w2_scale)
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
