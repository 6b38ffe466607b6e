"""From the fused qkv projection to what attention reads, in one kernel: per-head RMSNorm and
half-split (NeoX) rotary embedding of q and k, and the new k and v written into the paged KV cache.

The cache layout is [num_blocks, block_size, num_kv_heads, head_dim]; a token's slot is
block_id * block_size + offset. Padded rows carry slot -1 and write nothing, so a fixed-size
(CUDA-graph) batch can include empty rows. Rounding follows Hugging Face's bf16 semantics: the
normalised value is rounded before the weight multiplies it, and again before the rotation.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import pdl_launch, use_triton
from qwen3_runtime.ops.norms import add_rms_norm_reference

DECODE_ROWS = 64  # up to this many tokens, a program per (token, head)
PREFILL_TILE_TOKENS = 16  # above it, tokens per program


@triton.jit
def _attention_inputs_kernel(
    qkv_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_sin_ptr,
    positions_ptr,
    slot_mapping_ptr,
    q_ptr,
    k_ptr,
    k_cache_ptr,
    v_cache_ptr,
    num_tokens,
    num_heads,
    num_kv_heads,
    qkv_stride,
    head_dim,
    eps,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program per (BLOCK_T tokens, head) over q heads, then k heads, then v heads."""
    if USE_PDL:  # the attention kernel may launch now and wait
        gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    half = head_dim // 2
    offs = tl.arange(0, HALF_BLOCK)
    in_range = token < num_tokens
    mask = in_range[:, None] & (offs < half)[None, :]
    dtype = q_ptr.dtype.element_ty
    # The rows' slots and positions (staged by the host before the step), the norm weight and the rotary
    # table (constants) are read before the wait, while the projection before runs: after it only qkv is
    # a memory round trip away, where the table's address would otherwise wait for the position.
    slot = tl.load(slot_mapping_ptr + token, mask=in_range, other=-1).to(tl.int64)
    position = tl.load(positions_ptr + token, mask=in_range, other=0).to(tl.int64)
    is_q = head < num_heads
    is_v = head >= num_heads + num_kv_heads
    qk_mask = offs < tl.where(is_v, 0, half)  # v heads are copied as they are
    if is_q:
        w1 = tl.load(q_weight_ptr + offs, mask=qk_mask, other=0.0).to(tl.float32)
        w2 = tl.load(q_weight_ptr + half + offs, mask=qk_mask, other=0.0).to(tl.float32)
    else:
        w1 = tl.load(k_weight_ptr + offs, mask=qk_mask, other=0.0).to(tl.float32)
        w2 = tl.load(k_weight_ptr + half + offs, mask=qk_mask, other=0.0).to(tl.float32)
    table = cos_sin_ptr + position[:, None] * head_dim + offs[None, :]
    rope_mask = in_range[:, None] & qk_mask[None, :]
    cos = tl.load(table, mask=rope_mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(table + half, mask=rope_mask, other=0.0).to(dtype).to(tl.float32)
    if USE_PDL:  # this one waits for its predecessor
        gdc_wait()
    src = qkv_ptr + token[:, None] * qkv_stride + head * head_dim + offs[None, :]
    store_mask = (slot >= 0)[:, None] & mask  # padded rows (slot -1) are not stored
    slot = tl.maximum(slot, 0)  # a padded row's (masked) addresses stay inside the cache
    cache_row = ((slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_offset)[:, None]
    if is_v:
        dst = v_cache_ptr + cache_row + (head - num_heads - num_kv_heads) * stride_cache_head + offs[None, :]
        tl.store(dst, tl.load(src, mask=store_mask), mask=store_mask)
        tl.store(dst + half, tl.load(src + half, mask=store_mask), mask=store_mask)
        return
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / head_dim + eps)[:, None]
    x1 = ((x1 * inv_rms).to(dtype).to(tl.float32) * w1[None, :]).to(dtype).to(tl.float32)
    x2 = ((x2 * inv_rms).to(dtype).to(tl.float32) * w2[None, :]).to(dtype).to(tl.float32)
    out1, out2 = (x1 * cos - x2 * sin).to(dtype), (x2 * cos + x1 * sin).to(dtype)
    if is_q:
        dst = q_ptr + (token[:, None] * num_heads + head) * head_dim + offs[None, :]
        tl.store(dst, out1, mask=mask)
        tl.store(dst + half, out2, mask=mask)
    else:
        kv_head = head - num_heads
        dst = k_ptr + (token[:, None] * num_kv_heads + kv_head) * head_dim + offs[None, :]
        tl.store(dst, out1, mask=mask)
        tl.store(dst + half, out2, mask=mask)
        dst = k_cache_ptr + cache_row + kv_head * stride_cache_head + offs[None, :]
        tl.store(dst, out1, mask=store_mask)
        tl.store(dst + half, out2, mask=store_mask)


def attention_inputs(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos_sin: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    reference: bool = False,
    invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, H, D] and k [T, KVH, D], normed per head and rotated, and v [T, KVH, D] (a view of qkv),
    from qkv [T, (H + 2 KVH) D]; k and v also go into the caches at slot_mapping [T] (-1: skipped).
    `positions` and `slot_mapping` must be staged before the kernel that writes qkv (the kernel reads
    them before its PDL wait), as every forward stages them.
    `cos_sin` is [max_len, D]: cos over the first half of each row, sin over the second.
    `reference`: the PyTorch path even where Triton runs (`attention_inputs_reference`). `invariant`: the tile
    programs whatever the number of tokens (engine.batch_invariant: the per-head norm's sum is then reduced in
    the same order for every token)."""
    if reference or not use_triton(qkv):
        q, k = _norm_rope_reference(qkv, num_heads, num_kv_heads, (q_weight, k_weight), eps, cos_sin[positions])
        v = _v_view(qkv, num_heads, num_kv_heads, q_weight.shape[0])
        _store_kv_reference(k, v, k_cache, v_cache, slot_mapping)
        return q, k, v
    tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    assert qkv.stride(1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    assert k_cache.dtype == v_cache.dtype == qkv.dtype
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    # A decode step's few rows: a one-warp program per (row, head) starts soonest; a prefill's many tokens
    # take tiles of rows, so the programs are few enough not to be launch-bound.
    block_t, warps = (1, 1) if tokens <= DECODE_ROWS and not invariant else (PREFILL_TILE_TOKENS, 4)
    if tokens:
        _attention_inputs_kernel[(triton.cdiv(tokens, block_t), num_heads + 2 * num_kv_heads)](
            qkv,
            q_weight,
            k_weight,
            cos_sin,
            positions,
            slot_mapping,
            q,
            k,
            k_cache,
            v_cache,
            tokens,
            num_heads,
            num_kv_heads,
            qkv.stride(0),
            head_dim,
            eps,
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            BLOCK_SIZE=k_cache.shape[1],
            BLOCK_T=block_t,
            HALF_BLOCK=triton.next_power_of_2(head_dim // 2),
            num_warps=warps,
            **pdl_launch(qkv),
        )
    return q, k, _v_view(qkv, num_heads, num_kv_heads, head_dim)


def _v_view(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    return qkv[:, (num_heads + num_kv_heads) * head_dim :].view(qkv.shape[0], num_kv_heads, head_dim)


# The same function in PyTorch (several launches); for CPUs without Triton, and tests.
attention_inputs_reference = functools.partial(attention_inputs, reference=True)


def _norm_rope_reference(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    weights: tuple[torch.Tensor, torch.Tensor],
    eps: float,
    cos_sin_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] and k [T, KVH, D] of qkv, each head RMS-normed (weights: q's and k's) and rotated by
    cos_sin_rows [T, D] (each token's row of the cos/sin table)."""
    tokens, head_dim = qkv.shape[0], weights[0].shape[0]
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    cos, sin = cos_sin_rows.to(qkv.dtype)[:, None, :].chunk(2, dim=-1)

    def norm_rope(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = add_rms_norm_reference(x, weight, eps)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    q = norm_rope(q.reshape(tokens, num_heads, head_dim), weights[0])
    return q, norm_rope(k.reshape(tokens, num_kv_heads, head_dim), weights[1])


def _store_kv_reference(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k and v [T, KVH, D] into the paged caches at slot_mapping [T] (-1: skipped)."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // k_cache.shape[1], slots % k_cache.shape[1]
    k_cache[blocks, offsets] = k[valid]
    v_cache[blocks, offsets] = v[valid]
