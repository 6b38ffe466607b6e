"""The expert kernels of ops/fused_moe.py: grouped GEMMs over (token, slot) pairs, pair p = t * k + s being token t's
s-th routed expert.

A program takes one expert's pairs (up to BLOCK_M rows at a time) and one tile of BLOCK_N weight rows. It finds
its rows one of two ways, both static in shape (CUDA graphs) and neither syncing with the host:
- scan (decode sizes): program (group, column tile) reads the routing table itself: group j takes the j-th expert
  that has pairs (or expert j when there are at least as many pairs as experts), counts its pairs and gathers their
  indices in pair order, BLOCK_M at a time. An expert without pairs costs an exit, and no separate kernel sorts.
- sorted (large token counts): pairs sorted by expert beforehand, each expert's run cut into blocks of BLOCK_M, a
  table of (expert, first, end) per block (ops.fused_moe.group_by_expert); blocks past the used ones exit.
Pairs of padded rows (expert E) read no weight: gate/up skips them (their act rows stay unwritten and unread), down
writes their output rows' zeros.
Block-FP8 experts (SCALE_BLOCK > 0): each weight tile is converted to the activations' dtype in registers and each
K-tile's product scaled by its weight rows' scales (per expert, 128-row block and 128-column block), in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _matmul(
    a_ptr, a_rows, stride_a, b_ptr, b_rows, stride_b, K, s_ptr, expert, stride_se, stride_sn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """acc[m, n] = sum over k of A[a_rows[m], k] * B[b_rows[n], k], in fp32 over K in BLOCK_K steps. Every row index
    is in bounds (callers clamp those whose results they drop), so whole K-tiles load unmasked. SCALE_BLOCK: B is the
    expert's FP8 weight, B[n, k] times s[expert, n // SCALE_BLOCK, k // SCALE_BLOCK], each K-tile inside one block."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None].to(tl.int64) * stride_a + offs_k[None, :]
    b_ptrs = b_ptr + b_rows[None, :].to(tl.int64) * stride_b + offs_k[:, None]  # B^T tile [BLOCK_K, BLOCK_N]
    if SCALE_BLOCK:
        s_ptrs = s_ptr + expert.to(tl.int64) * stride_se + (b_rows // SCALE_BLOCK) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_mask = offs_k + k < K
            a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_mask[:, None], other=0.0)
        if SCALE_BLOCK:
            b = b.to(a.dtype)
        if UPCAST:  # the interpreter's dot (numpy) takes no bf16
            a, b = a.to(tl.float32), b.to(tl.float32)
        if SCALE_BLOCK:  # the K-tile's block column: one scale a weight row
            acc += tl.dot(a, b, input_precision=DOT_PRECISION) * tl.load(s_ptrs + k // SCALE_BLOCK)[None, :]
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc


@triton.jit
def _scan_expert(
    ids_ptr, num_pairs, num_experts, group, num_groups,
    COMPACT: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK_E: tl.constexpr,
):  # fmt: skip
    """The expert of scan group `group`: E (padded rows' pairs) for the last group; with COMPACT (fewer pairs than
    experts) the group-th lowest expert that has pairs, else expert `group`; E + 1 for none."""
    expert = group
    if COMPACT:
        experts = tl.arange(0, BLOCK_E)
        present = tl.zeros([BLOCK_E], tl.int32)
        for start in range(0, num_pairs, CHUNK_E):
            offs = start + tl.arange(0, CHUNK_E)
            ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
            present = tl.maximum(present, tl.max((ids[None, :] == experts[:, None]).to(tl.int32), axis=1))
        present = tl.where(experts < num_experts, present, 0)
        nth = (present > 0) & (tl.cumsum(present, axis=0) == group + 1)
        expert = tl.where(group < tl.sum(present, axis=0), tl.sum(tl.where(nth, experts, 0), axis=0), num_experts + 1)
    return tl.where(group == num_groups - 1, num_experts, expert)


@triton.jit
def _count_pairs(ids_ptr, num_pairs, expert, CHUNK: tl.constexpr):
    count = 0
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        count += tl.sum((tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1) == expert).to(tl.int32), axis=0)
    return count


@triton.jit
def _gather_pairs(ids_ptr, num_pairs, expert, first, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    """The indices of the expert's pairs number first .. first + BLOCK_M - 1, in pair order; -1 past its last."""
    wanted = first + tl.arange(0, BLOCK_M)
    rows = tl.full([BLOCK_M], -1, tl.int32)
    seen = 0
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        hits = (tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1) == expert).to(tl.int32)
        number = seen + tl.cumsum(hits, axis=0) - 1
        match = (hits[None, :] > 0) & (number[None, :] == wanted[:, None])
        rows = tl.maximum(rows, tl.max(tl.where(match, offs[None, :], -1), axis=1))
        seen += tl.sum(hits, axis=0)
    return rows


@triton.jit
def _block_of(pid, num_blocks, num_n, GROUP_M: tl.constexpr):
    """Sorted path: (row block, column tile) of program `pid`, GROUP_M row blocks side by side over every column
    tile, so their rows and weight tiles are re-read from L2."""
    per_group = GROUP_M * num_n
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(num_blocks - first, GROUP_M)
    return first + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def _sorted_rows(order_ptr, table_ptr, block, num_blocks, BLOCK_M: tl.constexpr):
    """Sorted path: the block's pair indices (-1 past its expert's last pair)."""
    first = tl.load(table_ptr + num_blocks + block)
    offs = first + tl.arange(0, BLOCK_M)
    return tl.load(order_ptr + offs, mask=offs < tl.load(table_ptr + 2 * num_blocks + block), other=-1)


@triton.jit
def _gate_up_tile(
    x_ptr, w_ptr, s_ptr, act_ptr, rows, expert, pid_n, top_k, inter, K,
    stride_x, stride_wn, stride_se, stride_sn, stride_act,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """act[rows, tile] = silu(gate) * up: the tile's weight rows alternate a gate row and its up row, so one product
    holds both halves of BLOCK_N // 2 act columns. Rounded as the reference: gate and up, then the product."""
    half = tl.arange(0, BLOCK_N) // 2
    cols = pid_n * (BLOCK_N // 2) + half
    w_rows = tl.where(cols < inter, cols + (tl.arange(0, BLOCK_N) % 2) * inter, 0)
    tokens = tl.where(rows >= 0, rows // top_k, 0)
    acc = _matmul(
        x_ptr, tokens, stride_x, w_ptr, w_rows, stride_wn, K, s_ptr, expert, stride_se, stride_sn,
        BLOCK_M, BLOCK_N, BLOCK_K, SCALE_BLOCK, EVEN_K, UPCAST, DOT_PRECISION,
    )  # fmt: skip
    gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
    dtype = act_ptr.dtype.element_ty
    gate, up = gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate)) * up
    out_cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    out = act_ptr + rows[:, None].to(tl.int64) * stride_act + out_cols[None, :]
    tl.store(out, act.to(dtype), mask=(rows[:, None] >= 0) & (out_cols[None, :] < inter))


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])  # one compiled kernel for every token count
def gate_up_kernel(
    x_ptr, w_ptr, s_ptr, ids_ptr, order_ptr, table_ptr, act_ptr,
    num_pairs, num_experts, top_k, inter, K, num_blocks, stride_x, stride_we, stride_wn, stride_se, stride_sn,
    stride_act,
    SORTED: tl.constexpr, COMPACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK_E: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """act [P, I] (x's dtype) = silu(x[t] @ gate^T) * (x[t] @ up^T) of pair p's expert, w [E, 2I, K] (FP8 with
    SCALE_BLOCK: scales s [E, 2I / SCALE_BLOCK, K / SCALE_BLOCK], I a multiple of SCALE_BLOCK)."""
    if USE_PDL:  # the routing comes from the previous kernels
        gdc_wait()
    if SORTED:
        block, pid_n = _block_of(tl.program_id(0), num_blocks, tl.cdiv(2 * inter, BLOCK_N), GROUP_M)
        expert = tl.load(table_ptr + block)
        if expert < num_experts:
            rows = _sorted_rows(order_ptr, table_ptr, block, num_blocks, BLOCK_M)
            _gate_up_tile(
                x_ptr, w_ptr + expert.to(tl.int64) * stride_we, s_ptr, act_ptr, rows, expert, pid_n, top_k, inter, K,
                stride_x, stride_wn, stride_se, stride_sn, stride_act,
                BLOCK_M, BLOCK_N, BLOCK_K, SCALE_BLOCK, EVEN_K, UPCAST, DOT_PRECISION,
            )  # fmt: skip
    else:
        pid_n = tl.program_id(1)
        expert = _scan_expert(
            ids_ptr, num_pairs, num_experts, tl.program_id(0), tl.num_programs(0), COMPACT, BLOCK_E, CHUNK_E
        )
        if expert < num_experts:
            for first in range(0, _count_pairs(ids_ptr, num_pairs, expert, CHUNK), BLOCK_M):
                rows = _gather_pairs(ids_ptr, num_pairs, expert, first, BLOCK_M, CHUNK)
                _gate_up_tile(
                    x_ptr, w_ptr + expert.to(tl.int64) * stride_we, s_ptr, act_ptr, rows, expert, pid_n, top_k,
                    inter, K, stride_x, stride_wn, stride_se, stride_sn, stride_act,
                    BLOCK_M, BLOCK_N, BLOCK_K, SCALE_BLOCK, EVEN_K, UPCAST, DOT_PRECISION,
                )  # fmt: skip
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()


@triton.jit
def _down_tile(
    act_ptr, w_ptr, s_ptr, weights_ptr, out_ptr, rows, expert, num_experts, pid_n, top_k, N, K,
    stride_act, stride_we, stride_wn, stride_se, stride_sn, stride_slot,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """out[s, t, tile] = weight[t, s] * (act[p] @ w[expert]^T) for the rows' pairs p = t * k + s; 0 for expert E."""
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = rows >= 0
    tokens, slots = rows // top_k, rows % top_k
    out = out_ptr + slots[:, None].to(tl.int64) * stride_slot + tokens[:, None].to(tl.int64) * N + cols[None, :]
    mask = valid[:, None] & (cols[None, :] < N)
    if expert == num_experts:  # padded rows: zeros, no weight read
        tl.store(out, tl.zeros((BLOCK_M, BLOCK_N), tl.float32), mask=mask)
    else:
        acc = _matmul(
            act_ptr, tl.where(valid, rows, 0), stride_act, w_ptr + expert.to(tl.int64) * stride_we,
            tl.where(cols < N, cols, 0), stride_wn, K, s_ptr, expert, stride_se, stride_sn,
            BLOCK_M, BLOCK_N, BLOCK_K, SCALE_BLOCK, EVEN_K, UPCAST, DOT_PRECISION,
        )  # fmt: skip
        weight = tl.load(weights_ptr + rows, mask=valid, other=0.0)
        tl.store(out, acc * weight[:, None], mask=mask)


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def down_kernel(
    act_ptr, w_ptr, s_ptr, ids_ptr, weights_ptr, order_ptr, table_ptr, out_ptr,
    num_pairs, num_experts, top_k, N, K, num_blocks, stride_act, stride_we, stride_wn, stride_se, stride_sn,
    stride_slot,
    SORTED: tl.constexpr, COMPACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK_E: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """out [k, T, N] fp32: each pair's expert output times its routing weight, w [E, N, K] (FP8 with SCALE_BLOCK:
    scales s [E, N / SCALE_BLOCK, K / SCALE_BLOCK], rounded up); every element written."""
    if USE_PDL:  # act comes from the previous kernel
        gdc_wait()
    if SORTED:
        block, pid_n = _block_of(tl.program_id(0), num_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
        expert = tl.load(table_ptr + block)
        if expert <= num_experts:
            rows = _sorted_rows(order_ptr, table_ptr, block, num_blocks, BLOCK_M)
            _down_tile(
                act_ptr, w_ptr, s_ptr, weights_ptr, out_ptr, rows, expert, num_experts, pid_n, top_k, N, K,
                stride_act, stride_we, stride_wn, stride_se, stride_sn, stride_slot,
                BLOCK_M, BLOCK_N, BLOCK_K, SCALE_BLOCK, EVEN_K, UPCAST, DOT_PRECISION,
            )  # fmt: skip
    else:
        pid_n = tl.program_id(1)
        expert = _scan_expert(
            ids_ptr, num_pairs, num_experts, tl.program_id(0), tl.num_programs(0), COMPACT, BLOCK_E, CHUNK_E
        )
        if expert <= num_experts:
            for first in range(0, _count_pairs(ids_ptr, num_pairs, expert, CHUNK), BLOCK_M):
                rows = _gather_pairs(ids_ptr, num_pairs, expert, first, BLOCK_M, CHUNK)
                _down_tile(
                    act_ptr, w_ptr, s_ptr, weights_ptr, out_ptr, rows, expert, num_experts, pid_n, top_k, N, K,
                    stride_act, stride_we, stride_wn, stride_se, stride_sn, stride_slot,
                    BLOCK_M, BLOCK_N, BLOCK_K, SCALE_BLOCK, EVEN_K, UPCAST, DOT_PRECISION,
                )  # fmt: skip
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()
