"""Paged decode attention: one new token per sequence, from its projected q/k/v to the attention output.

Split-KV (flash-decoding) in two kernels so that short batches still fill the GPU:
1. grid (batch, kv_head, num_splits): each program takes the query heads sharing
   one KV head (GQA group, padded to 16 rows so `tl.dot` uses tensor cores) and a
   contiguous token range of its row, runs an online softmax over BLOCK_N-token
   tiles gathered through the block table, and stores a normalised partial output
   and its log-sum-exp (base 2) to scratch.
   It also does what `attention_inputs` does for prefill, saving a launch per layer: each program
   norms and rotates its group's q heads from the raw qkv row, and the new token's k and v; the
   program whose range holds that token stores them into the cache and uses them from registers
   for that position (nothing in the kernel reads the slot it writes).
2. grid (batch, head): merges the splits with exp2(lse_i - max) weights.
With num_splits == 1 the first kernel writes the output itself and the merge is skipped.
The grid is static and every token range is derived on the device from seq_lens
(split length = ceil(seq_len / num_splits) rounded up to whole tiles), so the call
is CUDA-graph capturable: a split past the end of its row only marks itself empty
(lse = -inf) and the merge skips it; a row with seq_len 0 gets zeros and stores nothing.
"""
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import pdl_launch, use_triton
from qwen3_runtime.ops.attention_inputs import QKNormRope, attention_inputs_reference

# Tokens per tile: 32 measured best inside the Qwen3-4B step on the H200 (64 wins only past ~256 tokens/row).
BLOCK_N = 32
# Tensor-core dots need at least 16 rows, so a GQA group is padded up to this.
MIN_GROUP_ROWS = 16
# Enough programs for about two waves: latency hiding for the gathered loads.
PROGRAMS_PER_SM = 2
# Beyond this the per-split overhead (q load, partial write, merge) outweighs the parallelism.
MAX_SPLITS = 32


class DecodeWorkspace(NamedTuple):
    """Scratch for the split partials; pass one to reuse it across layers."""

    partial_out: torch.Tensor  # [B, H, num_splits, D] fp32, normalised per split
    partial_lse: torch.Tensor  # [B, H, num_splits] fp32, log2-sum-exp2 of scaled scores


def decode_workspace(batch: int, num_heads: int, num_splits: int, head_dim: int, device: torch.device) -> DecodeWorkspace:
    """Uninitialised scratch: every split the merge reads is written first."""
    return DecodeWorkspace(
        torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=device),
        torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=device),
    )


@triton.jit
def _norm_rope(x, partner, weight, weight_partner, cos, sin, first_half, eps, head_dim):
    """RMSNorm over each row of x [rows, D], then the half-split rotation, whose partner of element d
    is d +- D/2 (loaded as `partner`). Rounded as `attention_inputs` rounds."""
    dtype = x.dtype
    x, partner = x.to(tl.float32), partner.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / head_dim + eps)[:, None]
    x = ((x * inv_rms).to(dtype).to(tl.float32) * weight).to(dtype).to(tl.float32)
    partner = ((partner * inv_rms).to(dtype).to(tl.float32) * weight_partner).to(dtype).to(tl.float32)
    return tl.where(first_half, x * cos - partner * sin, x * cos + partner * sin).to(dtype)


@triton.jit
def _decode_split_kernel(
    qkv_ptr, q_weight_ptr, k_weight_ptr, cos_sin_ptr, positions_ptr, slot_mapping_ptr,
    k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    split_out_ptr, partial_lse_ptr,
    qk_scale_log2, eps, num_splits, num_heads, num_kv_heads, head_dim, group_size,
    stride_qkv, stride_cache_block, stride_cache_offset, stride_cache_head,
    stride_bt_b,
    stride_so_b, stride_so_h, stride_so_s,
    stride_pl_b, stride_pl_h,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SINGLE_SPLIT: tl.constexpr, USE_PDL: tl.constexpr,
):
    """split_out is the merge's fp32 scratch, or with SINGLE_SPLIT the output itself (no merge)."""
    if USE_PDL:  # launched early (ops.pdl_launch): wait for the previous kernel's writes
        gdc_wait()
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * group_size + offs_g
    g_mask = offs_g < group_size
    d_mask = offs_d < head_dim
    gd_mask = g_mask[:, None] & d_mask[None, :]
    split_out = split_out_ptr + row * stride_so_b + heads[:, None] * stride_so_h + split * stride_so_s + offs_d[None, :]
    partial_lse = partial_lse_ptr + row * stride_pl_b + heads * stride_pl_h + split

    # Whole tiles per split (plain arithmetic: nested jit calls are slow in the interpreter).
    seq_len = tl.load(seq_lens_ptr + row)
    num_tiles = (seq_len + BLOCK_N - 1) // BLOCK_N
    split_tokens = (num_tiles + num_splits - 1) // num_splits * BLOCK_N
    start = split * split_tokens
    end = tl.minimum(start + split_tokens, seq_len)
    if start >= end:
        if SINGLE_SPLIT:
            tl.store(split_out, tl.zeros([BLOCK_G, BLOCK_D], split_out_ptr.dtype.element_ty), mask=gd_mask)
        else:
            # lse -inf marks the split as empty (the merge's identity); its output stays unwritten.
            tl.store(partial_lse, tl.full([BLOCK_G], float("-inf"), tl.float32), mask=g_mask)
        return

    # The group's q heads and the new token's k, normed and rotated; its v as projected.
    dtype = qkv_ptr.dtype.element_ty  # the caches' too
    half = head_dim // 2
    partner_d = (offs_d + half) % head_dim
    first_half = offs_d[None, :] < half
    position = tl.load(positions_ptr + row).to(tl.int64)
    rotary = cos_sin_ptr + position * head_dim + offs_d[None, :] % half
    cos = tl.load(rotary, mask=d_mask[None, :], other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(rotary + half, mask=d_mask[None, :], other=0.0).to(dtype).to(tl.float32)
    qkv_row = qkv_ptr + row.to(tl.int64) * stride_qkv
    q_src = qkv_row + heads[:, None] * head_dim
    q = _norm_rope(tl.load(q_src + offs_d[None, :], mask=gd_mask, other=0.0),
                   tl.load(q_src + partner_d[None, :], mask=gd_mask, other=0.0),
                   tl.load(q_weight_ptr + offs_d[None, :], mask=d_mask[None, :], other=0.0).to(tl.float32),
                   tl.load(q_weight_ptr + partner_d[None, :], mask=d_mask[None, :], other=0.0).to(tl.float32),
                   cos, sin, first_half, eps, head_dim)
    k_src = qkv_row + (num_heads + kv_head) * head_dim
    new_k = _norm_rope(tl.load(k_src + offs_d[None, :], mask=d_mask[None, :], other=0.0),
                       tl.load(k_src + partner_d[None, :], mask=d_mask[None, :], other=0.0),
                       tl.load(k_weight_ptr + offs_d[None, :], mask=d_mask[None, :], other=0.0).to(tl.float32),
                       tl.load(k_weight_ptr + partner_d[None, :], mask=d_mask[None, :], other=0.0).to(tl.float32),
                       cos, sin, first_half, eps, head_dim)
    new_v = tl.load(qkv_row + (num_heads + num_kv_heads + kv_head) * head_dim + offs_d[None, :],
                    mask=d_mask[None, :], other=0.0)
    new_position = seq_len - 1
    slot = tl.load(slot_mapping_ptr + row).to(tl.int64)
    if (new_position < end) & (slot >= 0):  # this split holds the new token: store it (once per row)
        cache_row = (slot // PAGE_SIZE) * stride_cache_block + (slot % PAGE_SIZE) * stride_cache_offset
        cache_row += kv_head * stride_cache_head
        tl.store(k_cache_ptr + cache_row + offs_d[None, :], new_k, mask=d_mask[None, :])
        tl.store(v_cache_ptr + cache_row + offs_d[None, :], new_v, mask=d_mask[None, :])

    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    block_table = block_tables_ptr + row * stride_bt_b
    for tile_start in range(start, end, BLOCK_N):
        positions = tile_start + offs_n
        n_mask = positions < end
        # Masked positions never touch the block table: its tail may hold anything.
        block_ids = tl.load(block_table + positions // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        block_offsets = positions % PAGE_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        cache_rows = block_ids * stride_cache_block + block_offsets * stride_cache_offset + kv_head * stride_cache_head
        # The new token's slot is being written by this kernel: take it from registers.
        is_new = (positions == new_position)[:, None]
        k = tl.where(is_new, new_k, tl.load(k_cache_ptr + cache_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0))
        v = tl.where(is_new, new_v, tl.load(v_cache_ptr + cache_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0))

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        # Every tile holds at least one valid token, so new_max is finite.
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        alpha = tl.exp2(running_max - new_max)
        p = tl.exp2(scores - new_max[:, None])
        running_sum = running_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(dtype), v, input_precision=DOT_PRECISION)
        running_max = new_max

    tl.store(split_out, (acc / running_sum[:, None]).to(split_out_ptr.dtype.element_ty), mask=gd_mask)
    if not SINGLE_SPLIT:
        tl.store(partial_lse, running_max + tl.log2(running_sum), mask=g_mask)
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()


@triton.jit
def _decode_merge_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr,
    num_splits, head_dim,
    stride_po_b, stride_po_h, stride_po_s,
    stride_pl_b, stride_pl_h,
    stride_out_b, stride_out_h,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:  # launched early (ops.pdl_launch): wait for the previous kernel's writes
        gdc_wait()
    row = tl.program_id(0)
    head = tl.program_id(1)

    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    lse = tl.load(
        partial_lse_ptr + row * stride_pl_b + head * stride_pl_h + offs_s,
        mask=offs_s < num_splits, other=float("-inf"),
    )
    written = lse > float("-inf")
    parts = tl.load(
        partial_out_ptr + row * stride_po_b + head * stride_po_h
        + offs_s[:, None] * stride_po_s + offs_d[None, :],
        mask=written[:, None] & d_mask[None, :], other=0.0,
    )
    # A row with no tokens (seq_len 0) has no finite lse: shift by 0 so it gets zeros, not NaN.
    lse_max = tl.max(lse, axis=0)
    any_written = lse_max > float("-inf")
    weights = tl.exp2(lse - tl.where(any_written, lse_max, 0.0))
    total = tl.where(any_written, tl.sum(weights, axis=0), 1.0)
    merged = tl.sum(weights[:, None] * parts, axis=0) / total
    out = out_ptr + row * stride_out_b + head * stride_out_h + offs_d
    tl.store(out, merged.to(out_ptr.dtype.element_ty), mask=d_mask)
    if USE_PDL:  # last: the next kernel may launch
        gdc_launch_dependents()


def default_num_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Splits per (row, kv head) so the split kernel has about two programs per SM.

    Fixed per captured batch size; rows shorter than max_seq_len simply leave
    their trailing splits empty. num_sms: torch.cuda.get_device_properties(...).multi_processor_count.
    """
    wanted = math.ceil(PROGRAMS_PER_SM * num_sms / (batch_size * num_kv_heads))
    useful = math.ceil(max_seq_len / BLOCK_N)
    return max(1, min(wanted, useful, MAX_SPLITS))


def paged_decode_attention(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    prep: QKNormRope,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    workspace: DecodeWorkspace | None = None,
) -> torch.Tensor:
    """Attention output [B, H, D] of each row's new token (projected: qkv [B, (H + 2 KVH) D], at
    positions[b] == seq_lens[b] - 1) over its seq_lens[b] tokens, the new one stored at slot_mapping[b].

    Caches are [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks] int32.
    out (contiguous [B, H, D], qkv's dtype) and workspace are allocated when not given.
    """
    if not use_triton(qkv):
        reference = paged_decode_attention_reference(qkv, num_heads, num_kv_heads, prep, positions, slot_mapping,
                                                     k_cache, v_cache, block_tables, seq_lens, scale)
        return reference if out is None else out.copy_(reference)
    batch = qkv.shape[0]
    _, block_size, _, head_dim = k_cache.shape
    group_size = num_heads // num_kv_heads
    assert num_heads == group_size * num_kv_heads and num_splits >= 1
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and qkv.stride(1) == 1
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1 and k_cache.dtype == qkv.dtype
    if out is None:
        out = torch.empty(batch, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if batch == 0:
        return out
    if workspace is None:
        workspace = decode_workspace(batch, num_heads, num_splits, head_dim, qkv.device)
    partial_out, partial_lse = workspace
    assert partial_out.shape == (batch, num_heads, num_splits, head_dim) and out.is_contiguous()
    block_d = triton.next_power_of_2(head_dim)
    # One split needs no merge: it writes the output directly, saving a launch per layer.
    single_split = num_splits == 1
    split_out = out.unsqueeze(2) if single_split else partial_out

    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        qkv, prep.q_weight, prep.k_weight, prep.cos_sin, positions, slot_mapping,
        k_cache, v_cache, block_tables, seq_lens,
        split_out, partial_lse,
        scale * math.log2(math.e), prep.eps, num_splits, num_heads, num_kv_heads, head_dim, group_size,
        qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        split_out.stride(0), split_out.stride(1), split_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        BLOCK_G=max(MIN_GROUP_ROWS, triton.next_power_of_2(group_size)),
        BLOCK_N=BLOCK_N,
        BLOCK_D=block_d,
        PAGE_SIZE=block_size,  # constexpr: the page arithmetic becomes shifts
        # fp32 caches (tests) need exact products; tf32 would miss 1e-5.
        DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
        SINGLE_SPLIT=single_split,
        num_warps=4,
        **pdl_launch(qkv),
    )
    if single_split:
        return out
    _decode_merge_kernel[(batch, num_heads)](
        partial_out, partial_lse, out,
        num_splits, head_dim,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=block_d,
        num_warps=4,
        **pdl_launch(qkv),
    )
    return out


def paged_decode_attention_reference(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    prep: QKNormRope,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Prefill's two steps on one token per row: the inputs (cache store included), then attention."""
    q, _, _ = attention_inputs_reference(qkv, num_heads, num_kv_heads, prep, positions, k_cache, v_cache,
                                         slot_mapping)
    return cached_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale)


def cached_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
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
