"""Paged decode attention: one new query token per sequence against its cached K/V.

Split-KV (flash-decoding) in one kernel, grid (batch, kv_head, num_splits), so that short batches
still fill the GPU: each program takes the query heads sharing one KV head (GQA group, padded to 16
rows so `tl.dot` uses tensor cores) and a contiguous range of whole BLOCK_N-token tiles of its row,
gathered through the block table, and runs an online softmax over them. A row whose tokens fill one
split writes its output directly. Otherwise each split stores a normalised partial output and its
log-sum-exp (base 2), counts its arrival with an atomic, and the last of the row's splits to arrive
merges them (exp2(lse_i - max) weights, summed in a fixed order, so the result does not depend on which
split is last) and resets the count for the next call. Merging in this kernel rather than a second
one saves a launch per layer.

The grid is static and every range is derived on the device from seq_lens (split length =
ceil(tiles / num_splits) whole tiles), so the call is CUDA-graph capturable: splits past a row's
last token exit at once; a row with seq_len 0 gets zeros.
"""

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import num_sms, pdl_launch, use_triton

# Tokens per tile: the best inside the decode step at the context lengths served; 64 wins only on long rows.
BLOCK_N = 32
# Tensor-core dots need at least 16 rows, so a GQA group is padded up to this.
MIN_GROUP_ROWS = 16
# Enough programs for about two waves: latency hiding for the gathered loads.
PROGRAMS_PER_SM = 2
# Where (row, KV head) pairs fill at most half the SMs (up to 8 rows of Qwen3-4B): this many splits, about
# one tile each at a few hundred tokens. More would leave most programs empty and, at 8 rows, make more
# programs than the SMs hold at once, so o_proj, which launches only once all of them have started,
# preloads its weights later; fewer leave long rows short of parallelism.
FEW_PAIRS_SPLITS = 8
# Beyond this the per-split overhead (q load, partial write, merge) outweighs the parallelism.
MAX_SPLITS = 32
# From this many tokens a row is long: FEW_PAIRS_SPLITS splits of it leave most SMs idle while a few stream its
# K/V. A batch of few rows with a long one takes graphs of its own (long_row_splits): more splits in the one
# graph would cost short rows the empty programs.
LONG_ROW_TOKENS = 4096
# Partials the last split loads at once, (head, split) pairs: bounds its registers.
MERGE_TILE = 64
# Software-pipeline depth of the split's K/V loop. Where o_proj preloads its weights during attention
# (dependents_early) and attention has more than two programs an SM, one stage (13 KB of shared memory a
# program, against 37 KB at three) leaves room beside two of them for a preload program (198 KB). With
# fewer programs the deeper pipeline is faster.
STAGES, STAGES_BESIDE_PRELOAD = 3, 1


class DecodeWorkspace(NamedTuple):
    """Scratch for the split partials; pass one to reuse it across calls."""

    partial_out: torch.Tensor  # [B, H, num_splits, D] fp32, normalised per split
    partial_lse: torch.Tensor  # [B, H, num_splits] fp32, log2-sum-exp2 of scaled scores
    arrivals: torch.Tensor  # [B, KVH] int32, zero between calls: the splits of (row, KV head) done so far


def decode_workspace(
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    num_splits: int,
    head_dim: int,
    device: torch.device,
    arrivals: torch.Tensor | None = None,
) -> DecodeWorkspace:
    """Partials uninitialised (a split's are read only after it wrote them); `arrivals` zeros unless given:
    every call leaves the counts at zero, so one buffer, allocated before graph capture, serves them all."""
    if arrivals is None:
        arrivals = torch.zeros((batch, num_kv_heads), dtype=torch.int32, device=device)
    return DecodeWorkspace(
        torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=device),
        torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=device),
        arrivals,
    )


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    arrivals_ptr,
    qk_scale_log2,
    num_splits,
    head_dim,
    group_size,
    stride_q_b,
    stride_q_h,
    stride_k_block,
    stride_k_offset,
    stride_k_head,
    stride_v_block,
    stride_v_offset,
    stride_v_head,
    stride_bt_b,
    stride_out_b,
    stride_out_h,
    stride_po_b,
    stride_po_h,
    stride_po_s,
    stride_pl_b,
    stride_pl_h,
    stride_arrivals_b,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MERGE_G: tl.constexpr,
    MERGE_S: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
    DEPENDENTS_EARLY: tl.constexpr,
):
    """MERGE_G x MERGE_S: the (head, split) partials the last split merges per load (few registers where
    the splits are few, so a single-split launch pays nearly nothing for the merge it never runs).
    DEPENDENTS_EARLY: let the next kernels launch as this one starts (see paged_decode_attention)."""
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # seq_lens and the block table are staged by the host before the step and never written by a kernel,
    # so they are read while the predecessor runs: the first tile's block ids here, each next tile's
    # during the tile before, so that K and V are one memory round trip away, not two; this matters on
    # long rows. Masked positions never touch the block table: its tail may hold anything.
    seq_len = tl.load(seq_lens_ptr + row)
    # Whole tiles per split (plain arithmetic: nested jit calls are slow in the interpreter).
    num_tiles = (seq_len + BLOCK_N - 1) // BLOCK_N
    split_tiles = (num_tiles + num_splits - 1) // num_splits
    used_splits = (num_tiles + split_tiles - 1) // tl.maximum(split_tiles, 1)
    start = split * split_tiles * BLOCK_N
    end = tl.minimum(start + split_tiles * BLOCK_N, seq_len)
    offs_n = tl.arange(0, BLOCK_N)
    block_table = block_tables_ptr + row * stride_bt_b
    block_ids = tl.load(block_table + (start + offs_n) // PAGE_SIZE, mask=start + offs_n < end, other=0).to(tl.int64)
    if USE_PDL:  # launched early (ops.pdl_launch): wait for the previous kernel's writes
        if DEPENDENTS_EARLY:
            gdc_launch_dependents()
        gdc_wait()

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * group_size + offs_g
    g_mask = offs_g < group_size
    d_mask = offs_d < head_dim
    gd_mask = g_mask[:, None] & d_mask[None, :]
    out = out_ptr + row * stride_out_b + heads[:, None] * stride_out_h + offs_d[None, :]
    out_dtype = out_ptr.dtype.element_ty

    if start >= end:  # past the row's last token
        if split == 0:  # no tokens at all (a padded row)
            tl.store(out, tl.zeros([BLOCK_G, BLOCK_D], out_dtype), mask=gd_mask)
        return

    cache_dtype = k_cache_ptr.dtype.element_ty
    q = tl.load(
        q_ptr + row * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :],
        mask=gd_mask,
        other=0.0,
    ).to(cache_dtype)

    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        positions = tile_start + offs_n
        n_mask = positions < end
        block_offsets = positions % PAGE_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k_rows = block_ids * stride_k_block + block_offsets * stride_k_offset + kv_head * stride_k_head
        v_rows = block_ids * stride_v_block + block_offsets * stride_v_offset + kv_head * stride_v_head
        k = tl.load(k_cache_ptr + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        following = positions + BLOCK_N
        block_ids = tl.load(block_table + following // PAGE_SIZE, mask=following < end, other=0).to(tl.int64)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        # Every tile holds at least one valid token, so new_max is finite.
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        alpha = tl.exp2(running_max - new_max)
        p = tl.exp2(scores - new_max[:, None])
        running_sum = running_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(cache_dtype), v, input_precision=DOT_PRECISION)
        running_max = new_max

    if USE_PDL and not DEPENDENTS_EARLY:  # the next kernel may launch while the last split merges
        gdc_launch_dependents()
    if used_splits == 1:
        tl.store(out, (acc / running_sum[:, None]).to(out_dtype), mask=gd_mask)
    else:
        partial_out = partial_out_ptr + row * stride_po_b + split * stride_po_s
        partial_lse = partial_lse_ptr + row * stride_pl_b + split
        tl.store(partial_out + heads[:, None] * stride_po_h + offs_d[None, :], acc / running_sum[:, None], mask=gd_mask)
        tl.store(partial_lse + heads * stride_pl_h, running_max + tl.log2(running_sum), mask=g_mask)
        # Every thread's stores precede the count (release); the last split to arrive sees all the
        # others' (acquire), reading them from L2 (.cg): its L1 may hold an earlier call's.
        tl.debug_barrier()
        arrivals = arrivals_ptr + row * stride_arrivals_b + kv_head
        if tl.atomic_add(arrivals, 1, sem="acq_rel") == used_splits - 1:
            tl.store(arrivals, 0)
            _merge_splits(
                partial_out_ptr + row * stride_po_b,
                partial_lse_ptr + row * stride_pl_b,
                out_ptr + row * stride_out_b,
                kv_head * group_size,
                group_size,
                used_splits,
                head_dim,
                stride_po_h,
                stride_po_s,
                stride_pl_h,
                stride_out_h,
                MERGE_G,
                MERGE_S,
                BLOCK_D,
            )


@triton.jit
def _merge_splits(partial_out, partial_lse, out, first_head, group_size, used_splits, head_dim,
                  stride_po_h, stride_po_s, stride_pl_h, stride_out_h,
                  MERGE_G: tl.constexpr, MERGE_S: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """out[heads] = sum_i exp2(lse_i - max) * partial_i / sum_i exp2(lse_i - max) over the used splits,
    MERGE_S of them per load (the running max rescales across loads)."""
    offs_g = tl.arange(0, MERGE_G)
    offs_s = tl.arange(0, MERGE_S)
    offs_d = tl.arange(0, BLOCK_D)
    heads = first_head + offs_g
    g_mask = offs_g < group_size
    d_mask = offs_d < head_dim
    # Padded heads keep a max of 0, not -inf, so their weights are 0 rather than NaN.
    head_max = tl.where(g_mask, float("-inf"), 0.0)
    total = tl.zeros([MERGE_G], tl.float32)
    merged = tl.zeros([MERGE_G, BLOCK_D], tl.float32)
    for first in range(0, used_splits, MERGE_S):
        splits = first + offs_s
        gs_mask = g_mask[:, None] & (splits[None, :] < used_splits)
        lse = tl.load(
            partial_lse + heads[:, None] * stride_pl_h + splits[None, :],
            mask=gs_mask,
            other=float("-inf"),
            cache_modifier=".cg",
        )
        parts = tl.load(
            partial_out
            + heads[:, None, None] * stride_po_h
            + splits[None, :, None] * stride_po_s
            + offs_d[None, None, :],
            mask=gs_mask[:, :, None] & d_mask[None, None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        new_max = tl.maximum(head_max, tl.max(lse, axis=1))
        alpha = tl.exp2(head_max - new_max)
        weights = tl.exp2(lse - new_max[:, None])
        total = total * alpha + tl.sum(weights, axis=1)
        merged = merged * alpha[:, None] + tl.sum(weights[:, :, None] * parts, axis=1)
        head_max = new_max
    total = tl.where(g_mask, total, 1.0)
    tl.store(
        out + heads[:, None] * stride_out_h + offs_d[None, :],
        (merged / total[:, None]).to(out.dtype.element_ty),
        mask=g_mask[:, None] & d_mask[None, :],
    )


def default_num_splits(
    batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int, programs_per_sm: int | None = None
) -> int:
    """Splits per (row, kv head): FEW_PAIRS_SPLITS where the pairs fill at most half the SMs, otherwise
    enough for about `programs_per_sm` programs per SM (default two; given, it applies to any batch).

    Fixed per captured batch size; rows shorter than max_seq_len simply leave
    their trailing splits empty. num_sms: torch.cuda.get_device_properties(...).multi_processor_count.
    """
    pairs = batch_size * num_kv_heads
    if programs_per_sm is None and 2 * pairs <= num_sms:
        wanted = FEW_PAIRS_SPLITS
    else:
        wanted = math.ceil((programs_per_sm or PROGRAMS_PER_SM) * num_sms / pairs)
    useful = math.ceil(max_seq_len / BLOCK_N)
    return max(1, min(wanted, useful, MAX_SPLITS))


def long_row_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int | None:
    """Splits per (row, KV head) for a step whose longest row has LONG_ROW_TOKENS or more: enough for about
    PROGRAMS_PER_SM programs an SM, where that is at least three times default_num_splits' (one row of Qwen3's
    eight KV heads); None where it is not, or where rows reach LONG_ROW_TOKENS only as their last token.
    Not twice: at two rows the default grid is already about a program an SM, and doubling it did not pay
    (docs/BENCHMARKS.md, long contexts)."""
    if max_seq_len <= LONG_ROW_TOKENS:
        return None
    splits = min(math.ceil(PROGRAMS_PER_SM * num_sms / (batch_size * num_kv_heads)), MAX_SPLITS)
    return splits if splits >= 3 * default_num_splits(batch_size, num_kv_heads, max_seq_len, num_sms) else None


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    workspace: DecodeWorkspace | None = None,
    dependents_early: bool = False,
    arrivals: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [B, H, D] over each row's seq_lens[b] cached tokens; returns [B, H, D].

    Caches are [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks] int32.
    out (contiguous, q's shape and dtype) and workspace are allocated when not given; `arrivals` is the
    workspace's count buffer when no workspace is given (see decode_workspace).
    dependents_early: the kernel lets the next one launch as it starts, so that one is resident while
    attention runs; for a kernel that uses the time (ops/linear_preload.py); before the skinny
    projections it makes the step slower.
    """
    if not use_triton(q):
        reference = paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale)
        return reference if out is None else out.copy_(reference)
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group_size = num_heads // num_kv_heads
    assert num_heads == group_size * num_kv_heads and num_splits >= 1
    assert q.stride(2) == k_cache.stride(3) == v_cache.stride(3) == 1
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    if workspace is None:
        workspace = decode_workspace(batch, num_heads, num_kv_heads, num_splits, head_dim, q.device, arrivals)
    partial_out, partial_lse, arrivals = workspace
    assert partial_out.shape == (batch, num_heads, num_splits, head_dim) and out.stride(2) == 1
    assert arrivals.shape == (batch, num_kv_heads) and arrivals.dtype == torch.int32 and arrivals.stride(1) == 1
    merge_g = triton.next_power_of_2(group_size)
    grid_size = batch * num_kv_heads * num_splits
    _decode_attention_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        partial_out,
        partial_lse,
        arrivals,
        scale * math.log2(math.e),
        num_splits,
        head_dim,
        group_size,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        partial_out.stride(0),
        partial_out.stride(1),
        partial_out.stride(2),
        partial_lse.stride(0),
        partial_lse.stride(1),
        arrivals.stride(0),
        BLOCK_G=max(MIN_GROUP_ROWS, merge_g),
        BLOCK_N=BLOCK_N,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE_SIZE=block_size,  # constexpr: the page arithmetic becomes shifts
        MERGE_G=merge_g,
        MERGE_S=min(triton.next_power_of_2(num_splits), max(1, MERGE_TILE // merge_g)),
        # fp32 caches (tests) need exact products; tf32 would miss 1e-5.
        DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
        DEPENDENTS_EARLY=dependents_early,
        num_warps=4,
        num_stages=STAGES_BESIDE_PRELOAD if dependents_early and grid_size > 2 * num_sms(q.device) else STAGES,
        **pdl_launch(q),
    )
    return out


def paged_decode_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:  # fmt: skip
    """Plain PyTorch oracle: gather each row's K/V through its block table, softmax in fp32."""
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group_size = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    for row, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        blocks = block_tables[row, : math.ceil(seq_len / block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group_size, dim=1)
        v = v_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group_size, dim=1)
        scores = torch.einsum("hd,thd->ht", q[row].float(), k) * scale
        out[row] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v).to(q.dtype)
    return out
