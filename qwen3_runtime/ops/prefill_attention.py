"""Causal attention of a prefill's new tokens over the paged KV cache: whole prompts, chunks of a prompt
and prompts whose prefix is already cached alike.

The new tokens of B sequences are packed back to back in q; their K/V are already in the cache
(`attention_inputs` writes them first), so every key, cached prefix or new, is read through the block
table. Query i of sequence b sits at position seq_lens[b] - query_lens[b] + i and attends to positions
0..that one.

Flash attention in one kernel, one program per (query tile, KV head). A tile is BLOCK_Q consecutive new
tokens of one sequence; the program takes all the query heads sharing its KV head (the GQA group) for
them, flattened to BLOCK_Q * group rows, so each K/V tile it gathers serves the whole group. It runs an
online softmax (fp32 max, sum and output; exp2 with the scale folded into log2 units) over BLOCK_N-key
tiles in two loops: the keys every row of the tile sees, unmasked, then the tiles across the diagonal,
causally masked, up to the tile's last query and no further. The tile table is built on the host with
the other per-forward tensors (PrefillPlan), heaviest tiles first so the longest programs start first;
every layer reuses it, and the kernel never waits for the host. Tiles of sequence -1 pad a CUDA graph's grid.

`attend_prefill` sends the longest sequence without a cached prefix (a whole prompt or its first chunk), if it
has CUDNN_MIN_TOKENS tokens or more, to cuDNN's fused attention over its own K/V instead (this kernel skips
its tiles): a long prompt's attention is where that kernel's Hopper pipeline (asynchronous loads overlapping
both products and the softmax) gains most over this one (scripts/bench_prefill_attention.py). Its bits differ
from this kernel's, so batch-invariant mode keeps this one.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

from qwen3_runtime.ops import cdiv, use_triton

# Sized for sm_90 at head_dim 128 (scripts/bench_prefill_attention.py times them against alternatives).
# Query rows (tokens x the GQA group) per program: each gathered K/V tile serves this many rows (16 tokens of
# Qwen3-4B's group of 4); smaller tiles give more programs, so the short chunks after a long prefix still fill
# the SMs.
BLOCK_M = 64
# Keys per K/V tile, each a gather of BLOCK_N rows through the block table.
BLOCK_N = 64
# Four warps hold the 64 x 128 fp32 output; three stages keep two K/V tiles in flight while one is multiplied.
NUM_WARPS = 4
NUM_STAGES = 3
# From this many new tokens of one sequence without a cached prefix on, attend_prefill takes cuDNN. Below,
# this kernel is close to it, and the prompts of the default CUDA-graph buckets
# (prefill_graph_max_tokens) take the same kernel whether their step is captured (cuDNN is not) or eager.
CUDNN_MIN_TOKENS = 2049
# cuDNN builds an execution plan per sequence length (slow, at each new length); its ragged path, for
# q, k, v and the output in [tokens, heads, D] layout, serves every length from one plan. PyTorch calls that
# path experimental: tests/ops/test_prefill_attention.py checks it against the reference.
os.environ.setdefault("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", "1")
warnings.filterwarnings("ignore", message="TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 is currently experimental")


def tile_tokens(group_size: int, block_m: int = BLOCK_M) -> int:
    """New tokens per tile: a tile's rows are its tokens times the GQA group."""
    return max(1, block_m // group_size)


def max_tiles(num_tokens: int, max_seqs: int, block_q: int) -> int:
    """The most tiles `num_tokens` new tokens of at most `max_seqs` sequences take (each sequence's last tile
    may be partial): the fixed grid of a CUDA graph that replays any such batch."""
    return cdiv(num_tokens, block_q) + min(num_tokens, max_seqs)


def tile_table(query_lens: list[int], seq_lens: list[int], block_q: int) -> tuple[np.ndarray, np.ndarray]:
    """query_start_loc [B+1] and the tiles [num_tiles, 2] (sequence, its first new token in the tile),
    heaviest first, as int64."""
    q_lens, s_lens = np.asarray(query_lens, dtype=np.int64), np.asarray(seq_lens, dtype=np.int64)
    assert (q_lens <= s_lens).all()
    starts = np.zeros(len(q_lens) + 1, dtype=np.int64)
    np.cumsum(q_lens, out=starts[1:])
    tiles_per_seq = -(-q_lens // block_q)
    tile_seq = np.repeat(np.arange(len(q_lens)), tiles_per_seq)
    tile_first = np.arange(len(tile_seq)) - np.repeat(np.cumsum(tiles_per_seq) - tiles_per_seq, tiles_per_seq)
    tile_first *= block_q
    # Keys a tile attends to: up to its last query's position.
    tile_keys = s_lens[tile_seq] - q_lens[tile_seq] + np.minimum(tile_first + block_q, q_lens[tile_seq])
    order = np.argsort(-tile_keys, kind="stable")
    return starts, np.stack([tile_seq[order], tile_first[order]], axis=1)


@dataclass
class PrefillPlan:
    """Per prefill forward (host ints -> one device copy), shared by every layer. A CUDA-graphed prefill reads
    its plan from static buffers sized for the graph (prefill_inputs.py): the tile table then ends in padding
    tiles (sequence -1), which the kernel skips."""

    query_start_loc: torch.Tensor  # [B+1] int32: sequence b's new tokens are rows qsl[b]:qsl[b+1] of q
    seq_lens: torch.Tensor  # [B] int32: context length after this forward (cached prefix + new tokens)
    block_tables: torch.Tensor  # [B, max_blocks] int32 (rows padded with 0, never read)
    tiles: torch.Tensor  # [num_tiles, 2] int32: (sequence, its first new token in the tile), heaviest first
    block_q: int  # new tokens per tile
    group_size: int  # query heads per KV head the tiles are sized for
    host_query_lens: list[int]
    host_seq_lens: list[int]

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        device: torch.device,
        *,
        group_size: int,
        block_m: int = BLOCK_M,
    ) -> PrefillPlan:
        """query_lens[b] new tokens of sequence b, seq_lens[b] its length with them, block_tables[b] its
        cache blocks; group_size: query heads per KV head (a tile holds block_m // group_size tokens)."""
        block_q = tile_tokens(group_size, block_m)
        starts, tiles = tile_table(query_lens, seq_lens, block_q)
        table = np.zeros((len(query_lens), max(1, max(map(len, block_tables), default=0))), dtype=np.int64)
        for row, blocks in enumerate(block_tables):
            table[row, : len(blocks)] = blocks
        packed = np.concatenate([starts, seq_lens, table.ravel(), tiles.ravel()]).astype(np.int32)
        on_device = torch.as_tensor(packed).to(device, non_blocking=True)
        parts = on_device.split([len(starts), len(seq_lens), table.size, tiles.size])
        return cls(
            parts[0], parts[1], parts[2].view(table.shape), parts[3].view(-1, 2), block_q, group_size,
            list(query_lens), list(seq_lens),
        )  # fmt: skip


@triton.jit(do_not_specialize=["skip_seq"])  # one compiled kernel whatever the sequence skipped
def _prefill_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, tiles_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    qk_scale_log2, skip_seq, stride_q_t, stride_q_h, stride_k_block, stride_k_offset, stride_k_head,
    stride_v_block, stride_v_offset, stride_v_head, stride_out_t, stride_out_h, stride_bt_b,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Row m of the program is new token first + m // GROUP and query head kv_head * GROUP + m % GROUP.
    UPCAST: compute in fp32 (the interpreter's bf16 dot is wrong)."""
    tile = tl.program_id(0) // NUM_KV_HEADS
    kv_head = tl.program_id(0) % NUM_KV_HEADS
    seq = tl.load(tiles_ptr + 2 * tile)
    if seq < 0 or seq == skip_seq:  # a padding tile of a CUDA graph's fixed grid, or cuDNN's sequence
        return
    first = tl.load(tiles_ptr + 2 * tile + 1)
    q_begin = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    prefix = tl.load(seq_lens_ptr + seq) - query_len
    # Keys [0, full_end) are seen by every row of the tile (whole tiles before its first query's
    # position); [full_end, kv_end) cross the diagonal, kv_end being one past its last query's position.
    full_end = (prefix + first + 1) // BLOCK_N * BLOCK_N
    kv_end = prefix + tl.minimum(first + BLOCK_Q, query_len)

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM  # all true (folded away) when the head dim is a power of two
    token = first + offs_m // GROUP
    m_mask = (offs_m < BLOCK_Q * GROUP) & (token < query_len)
    # Rows past the tile's queries read q as 0 and are never stored. The first K/V tile holds a key at
    # or before every row's position, so no row's max stays -inf (which would make NaNs).
    position = prefix + token
    rows = (q_begin + token).to(tl.int64)
    heads = kv_head * GROUP + offs_m % GROUP
    md_mask = m_mask[:, None] & d_mask[None, :]
    q = tl.load(
        q_ptr + rows[:, None] * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :], mask=md_mask, other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)

    block_table = block_tables_ptr + seq * stride_bt_b
    k_base = k_cache_ptr + kv_head * stride_k_head + offs_d[None, :]
    v_base = v_cache_ptr + kv_head * stride_v_head + offs_d[None, :]
    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, full_end, BLOCK_N):
        running_max, running_sum, acc = _attend_tile(
            q, k_base, v_base, block_table, start + offs_n, position, kv_end, d_mask, qk_scale_log2,
            running_max, running_sum, acc, stride_k_block, stride_k_offset, stride_v_block, stride_v_offset,
            PAGE_SIZE, False, UPCAST, DOT_PRECISION,
        )  # fmt: skip
    for start in range(full_end, kv_end, BLOCK_N):
        running_max, running_sum, acc = _attend_tile(
            q, k_base, v_base, block_table, start + offs_n, position, kv_end, d_mask, qk_scale_log2,
            running_max, running_sum, acc, stride_k_block, stride_k_offset, stride_v_block, stride_v_offset,
            PAGE_SIZE, True, UPCAST, DOT_PRECISION,
        )  # fmt: skip

    out = acc / running_sum[:, None]
    out_ptrs = out_ptr + rows[:, None] * stride_out_t + heads[:, None] * stride_out_h + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=md_mask)


@triton.jit
def _attend_tile(q, k_base, v_base, block_table, keys, position, kv_end, d_mask, qk_scale_log2,
                 running_max, running_sum, acc, stride_k_block, stride_k_offset, stride_v_block, stride_v_offset,
                 PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):  # fmt: skip
    """One online-softmax step over the keys at positions `keys`, gathered through the block table.
    CAUSAL: the tile crosses the diagonal (key <= the row's position; keys from kv_end on are not read);
    otherwise every key is below every row's position and nothing is masked."""
    if CAUSAL:
        n_mask = keys < kv_end
        block_ids = tl.load(block_table + keys // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
    else:
        block_ids = tl.load(block_table + keys // PAGE_SIZE).to(tl.int64)
        kv_mask = d_mask[None, :]
    offsets = keys % PAGE_SIZE
    k = tl.load(k_base + (block_ids * stride_k_block + offsets * stride_k_offset)[:, None], mask=kv_mask, other=0.0)
    v = tl.load(v_base + (block_ids * stride_v_block + offsets * stride_v_offset)[:, None], mask=kv_mask, other=0.0)
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if CAUSAL:
        scores = tl.where(keys[None, :] <= position[:, None], scores, float("-inf"))
    # The max is of the unscaled scores and the scale applied after the subtraction, so the compiler cannot
    # fuse the scaling into the subtraction (an FMA) where no mask stands between them: a key tile then
    # gives the same bits in either loop, and a token the same output whatever chunk it is prefilled in.
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    alpha = tl.exp2((running_max - new_max) * qk_scale_log2)
    p = tl.exp2((scores - new_max[:, None]) * qk_scale_log2)
    running_sum = running_sum * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return new_max, running_sum, acc


def attend_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: PrefillPlan,
    scale: float,
    invariant: bool = False,
) -> torch.Tensor:
    """The attention of a prefill forward: q [T, Hq, D] and the new tokens' own k, v [T, KVH, D] (already in
    the caches). Outside a CUDA graph the longest sequence without a cached prefix, if it has CUDNN_MIN_TOKENS
    tokens or more, attends through cuDNN over its own k, v; the others through the paged kernel (in the same
    forward: decoding rows ride in prefill steps). invariant: the paged kernel alone (engine.batch_invariant)."""
    seq = _cudnn_sequence(q, plan, invariant)
    if seq is None:
        return paged_prefill_attention(q, k_cache, v_cache, plan, scale)
    begin = sum(plan.host_query_lens[:seq])
    rows = slice(begin, begin + plan.host_query_lens[seq])
    # [1, heads, tokens, D] views of [tokens, heads, D] tensors (v is a view of the qkv rows: copied, small)
    heads_first = [t[rows].contiguous().unsqueeze(0).transpose(1, 2) for t in (q, k, v)]
    if not torch.backends.cuda.can_use_cudnn_attention(
        torch.backends.cuda.SDPAParams(*heads_first, None, 0.0, True, True)
    ):
        return paged_prefill_attention(q, k_cache, v_cache, plan, scale)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        attended = F.scaled_dot_product_attention(*heads_first, is_causal=True, scale=scale, enable_gqa=True)
    attended = attended[0].transpose(0, 1)
    if rows.stop - rows.start == q.shape[0]:  # the forward's only tokens
        return attended
    out = paged_prefill_attention(q, k_cache, v_cache, plan, scale, skip_seq=seq)
    out[rows] = attended
    return out


def _cudnn_sequence(q: torch.Tensor, plan: PrefillPlan, invariant: bool) -> int | None:
    """The sequence attend_prefill sends to cuDNN, if any: the longest without a cached prefix, from
    CUDNN_MIN_TOKENS new tokens; none in a CUDA graph's capture or in batch-invariant mode."""
    if invariant or not q.is_cuda or torch.cuda.is_current_stream_capturing():
        return None
    lengths = [n if n == seq_len else 0 for n, seq_len in zip(plan.host_query_lens, plan.host_seq_lens)]
    longest = max(lengths, default=0)
    return lengths.index(longest) if longest >= CUDNN_MIN_TOKENS else None


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: PrefillPlan,
    scale: float,
    out: torch.Tensor | None = None,
    skip_seq: int = -1,
) -> torch.Tensor:
    """q [T, Hq, D] (T = sum of query_lens); k_cache/v_cache [num_blocks, block_size, KVH, D] (one layer's,
    the new tokens' K/V already stored); returns [T, Hq, D] in q's dtype (into `out` if given). Query i of
    sequence b sits at position seq_lens[b] - query_lens[b] + i and attends to positions 0..that one.
    skip_seq: a sequence whose rows are left unwritten (attend_prefill's cuDNN sequence)."""
    if not use_triton(q):
        return _prefill_sdpa(q, k_cache, v_cache, plan, scale, torch.empty_like(q) if out is None else out, skip_seq)
    tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group_size = num_heads // num_kv_heads
    assert num_heads == group_size * num_kv_heads and group_size == plan.group_size
    assert q.stride(2) == k_cache.stride(3) == v_cache.stride(3) == 1 and k_cache.dtype == v_cache.dtype
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    assert out.shape == q.shape and out.stride(2) == 1
    num_tiles = plan.tiles.shape[0]
    if num_tiles == 0:
        return out
    _prefill_attention_kernel[(num_tiles * num_kv_heads,)](
        q, k_cache, v_cache, out, plan.tiles, plan.query_start_loc, plan.seq_lens, plan.block_tables,
        scale * math.log2(math.e), skip_seq, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        plan.block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group_size,
        BLOCK_Q=plan.block_q,
        BLOCK_M=max(16, triton.next_power_of_2(plan.block_q * group_size)),  # tensor-core dots: 16 rows or more
        BLOCK_N=BLOCK_N,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PAGE_SIZE=block_size,  # constexpr: the page arithmetic becomes shifts
        UPCAST=not q.is_cuda and k_cache.dtype != torch.float32,  # the interpreter
        # fp32 caches (tests) need exact products; tf32 would miss 1e-5.
        DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )  # fmt: skip
    return out


def _gathered(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """A sequence's first seq_len rows of a paged cache, [seq_len, KVH, D]."""
    blocks = block_table[: -(-seq_len // cache.shape[1])].long()
    return cache[blocks].flatten(0, 1)[:seq_len]


def _causal_mask(query_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """[query_len, seq_len] bool: the new token i (position seq_len - query_len + i) sees keys 0..that position."""
    positions = torch.arange(seq_len - query_len, seq_len, device=device)
    return torch.arange(seq_len, device=device)[None, :] <= positions[:, None]


def _sequences(plan: PrefillPlan):
    """(b, first row in q, query_len, seq_len) of each sequence with new tokens."""
    start = 0
    for b, (query_len, seq_len) in enumerate(zip(plan.host_query_lens, plan.host_seq_lens)):
        if query_len:
            yield b, start, query_len, seq_len
        start += query_len


def _prefill_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: PrefillPlan,
    scale: float,
    out: torch.Tensor,
    skip_seq: int,
) -> torch.Tensor:
    """The path without Triton (CPUs): per-sequence SDPA over the gathered K/V with the offset causal mask."""
    for b, start, query_len, seq_len in _sequences(plan):
        if b == skip_seq:
            continue
        k, v = (_gathered(cache, plan.block_tables[b], seq_len).transpose(0, 1) for cache in (k_cache, v_cache))
        seq_q = q[start : start + query_len].transpose(0, 1)  # SDPA wants [heads, tokens, D]
        mask = _causal_mask(query_len, seq_len, q.device)
        seq_out = F.scaled_dot_product_attention(seq_q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start : start + query_len] = seq_out.transpose(0, 1)
    return out


def paged_prefill_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: PrefillPlan, scale: float
) -> torch.Tensor:
    """Plain PyTorch oracle in fp32: gather each sequence's K/V through its block table, repeat the KV heads
    over their groups, mask the scores causally (offset by the cached prefix), softmax."""
    group_size = q.shape[1] // k_cache.shape[2]
    out = torch.zeros_like(q)
    for b, start, query_len, seq_len in _sequences(plan):
        k, v = (
            _gathered(cache, plan.block_tables[b], seq_len).float().repeat_interleave(group_size, dim=1)
            for cache in (k_cache, v_cache)
        )
        scores = torch.einsum("qhd,khd->hqk", q[start : start + query_len].float(), k) * scale
        scores = scores.masked_fill(~_causal_mask(query_len, seq_len, q.device), float("-inf"))
        out[start : start + query_len] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).to(q.dtype)
    return out
