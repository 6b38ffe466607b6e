"""Triton kernels of `reduce_logprobs` (imported lazily: only when Triton runs).

Stage 1, one program per (vocab chunk, row): per-chunk max, sum of exp (NaN if
the chunk holds a NaN or +inf), the count of elements ranked ahead of the
selected token, and (when top-k is asked) the maximum of every BLOCK elements.

Stage 2, one program per row: merges the chunks in a fixed order
(lse = M + log sum s_i exp(m_i - M)) and selects the exact top-k:

* Order keys: an int64 whose high word is an order-preserving integer of the
  fp32 bits and whose low word is 0x7FFFFFFF - id, so "larger key" means
  "larger value, then lower id". Keys are unique, so every selection is exact.
* The top-k elements lie in the top-k blocks by (block max, block id): each
  of those k blocks holds an element ranked above anything in another block.
* The top-k blocks: the k-th largest maximum of groups of GROUP blocks is a
  key that at least k block maxima reach, so only blocks reaching it compete
  (typically k to 1.5k of ~1200); they are compacted and ranked by counting.
* The top-k elements: gather the k blocks, keep the elements reaching the
  smallest of the k block maxima (typically k of them), rank by counting.
* If more than CANDIDATES compete (heavy ties, clustered values), k rounds of
  max over the same keys give the same answer, only slower.

No atomics, and each row's arithmetic depends only on that row: results are
bitwise reproducible and independent of N. With PDL (programmatic dependent
launch, Hopper) stage 2 is launched while stage 1 runs and waits for it.
"""
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import TRITON_INTERPRET

KEY_NONE = tl.constexpr(-0x7FFFFFFFFFFFFFFF)  # below every real key
KEY_ALL = tl.constexpr(0x7FFFFFFFFFFFFFFF)  # above every real key
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _order_key(x, ids):
    """Unique int64 key: larger means larger value, then lower id (-0.0 ties +0.0)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)


@triton.jit
def _key_value(key):
    ordered = (key >> 32).to(tl.int32)
    bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _key_id(key):
    return 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def _kth_largest(keys, k):
    """The k-th largest of a 1-D tile of keys (KEY_NONE if fewer than k are real)."""
    ahead = tl.sum((keys[None, :] > keys[:, None]).to(tl.int32), axis=1)
    return tl.max(tl.where(ahead >= k - 1, keys, KEY_NONE), axis=0)


@triton.jit
def _top_by_counting(cand, K_PAD: tl.constexpr):
    """Keys of rank 0..K_PAD-1 of a small 1-D tile, by counting how many beat each."""
    ahead = tl.sum((cand[None, :] > cand[:, None]).to(tl.int32), axis=1)
    pos = tl.arange(0, K_PAD)
    return tl.max(tl.where(ahead[None, :] == pos[:, None], cand[None, :], KEY_NONE), axis=1)


@triton.jit
def _top_by_rounds(keys, k, K_PAD: tl.constexpr):
    """The k largest keys, one max per round: the exact fallback for many candidates."""
    pos = tl.arange(0, K_PAD)
    top = tl.full([K_PAD], KEY_NONE, tl.int64)
    for i in range(k):
        best = tl.max(keys, axis=0)
        top = tl.where(pos == i, best, top)
        keys = tl.where(keys == best, KEY_NONE, keys)
    return top


@triton.jit
def _top_keys_above(keys, threshold, k, scratch_ptr, K_PAD: tl.constexpr, CANDIDATES: tl.constexpr):
    """The k largest keys of a 1-D tile, given a threshold that at least k keys reach.

    The keys reaching it are compacted (prefix sum) into this row's scratch and
    ranked by counting; too many of them fall back to rounds of max.
    """
    chosen = (keys >= threshold) & (keys != KEY_NONE)
    n_chosen = tl.sum(chosen.to(tl.int32), axis=0)
    top = tl.full([K_PAD], KEY_NONE, tl.int64)
    if n_chosen <= CANDIDATES:
        slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        tl.store(scratch_ptr + slot, keys, mask=chosen)
        tl.debug_barrier()
        i = tl.arange(0, CANDIDATES)
        cand = tl.load(scratch_ptr + i, mask=i < n_chosen, other=KEY_NONE)
        top = _top_by_counting(cand, K_PAD)
    else:
        top = _top_by_rounds(keys, k, K_PAD)
    return top


@triton.jit
def _top_k_keys(block_max, blk, row_ptr, scratch_ptr, k, vocab, n_blocks,
                BLOCK: tl.constexpr, GROUPS_PAD: tl.constexpr, GROUP: tl.constexpr,
                K_PAD: tl.constexpr, CANDIDATES: tl.constexpr):
    """Keys of the row's k largest elements (value descending, id ascending), KEY_NONE past k.

    `block_max` is the [GROUPS_PAD, GROUP] tile of block maxima, `blk` their block ids.
    """
    block_keys = tl.where(blk < n_blocks, _order_key(block_max, blk), KEY_NONE)
    threshold = _kth_largest(tl.max(block_keys, axis=1), k)
    block_keys = tl.reshape(block_keys, [GROUPS_PAD * GROUP])
    top_blocks = _top_keys_above(block_keys, threshold, k, scratch_ptr, K_PAD, CANDIDATES)

    pos = tl.arange(0, K_PAD)
    use = (pos < k) & (top_blocks != KEY_NONE)
    ids = tl.where(use, _key_id(top_blocks), 0)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    present = use[:, None] & (ids < vocab)
    x = tl.load(row_ptr + ids, mask=present, other=0.0).to(tl.float32)
    keys = tl.where(present, _order_key(x, ids), KEY_NONE)
    threshold = tl.min(tl.where(pos < k, tl.max(keys, axis=1), KEY_ALL), axis=0)
    keys = tl.reshape(keys, [K_PAD * BLOCK])
    return _top_keys_above(keys, threshold, k, scratch_ptr + CANDIDATES, K_PAD, CANDIDATES)


@triton.jit
def chunk_stats_kernel(logits_ptr, row_stride, token_ptr, num_top_ptr, row_mask_ptr,
                       chunk_max_ptr, chunk_sumexp_ptr, chunk_ahead_ptr, block_max_ptr,
                       vocab, n_chunks, n_blocks,
                       HAS_MASK: tl.constexpr, USE_PDL: tl.constexpr, K_MAX: tl.constexpr,
                       BLOCK: tl.constexpr, BLOCKS_PER_CHUNK: tl.constexpr):
    """Stage 1, one program per (chunk, row)."""
    if USE_PDL:
        gdc_launch_dependents()  # stage 2 may start launching; it waits for this grid's results
    chunk = tl.program_id(0)
    row = tl.program_id(1)
    if HAS_MASK:
        if tl.load(row_mask_ptr + row) == 0:
            return
    row64 = row.to(tl.int64)
    row_ptr = logits_ptr + row64 * row_stride
    token = tl.load(token_ptr + row)
    token = tl.where((token >= 0) & (token < vocab), token, 0).to(tl.int32)  # a bad token's rank is unused
    target = tl.load(row_ptr + token).to(tl.float32)

    blk = chunk * BLOCKS_PER_CHUNK + tl.arange(0, BLOCKS_PER_CHUNK)
    ids = blk[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(row_ptr + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    block_max = tl.max(x, axis=1)  # a NaN need not show here: it makes the sum NaN
    peak = tl.max(block_max, axis=0)
    shifted = x - tl.where(peak == float("-inf"), 0.0, peak)
    sumexp = tl.sum(tl.math.exp2(shifted * LOG2E))
    ahead = tl.full([], 0, tl.int32)
    if peak >= target:  # otherwise nothing here ranks ahead of the token (the usual case for sampled tokens)
        beats = (x > target) | ((x == target) & (ids < token))
        ahead = tl.sum(beats.to(tl.int32))

    stat = row64 * n_chunks + chunk
    tl.store(chunk_max_ptr + stat, peak)
    tl.store(chunk_sumexp_ptr + stat, sumexp)
    tl.store(chunk_ahead_ptr + stat, ahead)
    if K_MAX > 0:
        blocks_wanted = tl.where(tl.load(num_top_ptr + row) > 0, n_blocks, 0)
        tl.store(block_max_ptr + row64 * n_blocks + blk, block_max, mask=blk < blocks_wanted)


@triton.jit
def finish_rows_kernel(logits_ptr, row_stride, token_ptr, num_top_ptr, row_mask_ptr,
                       chunk_max_ptr, chunk_sumexp_ptr, chunk_ahead_ptr, block_max_ptr,
                       candidates_ptr, logprob_ptr, rank_ptr, lse_ptr, top_ids_ptr, top_lp_ptr, status_ptr,
                       vocab, n_chunks, n_blocks,
                       HAS_MASK: tl.constexpr, USE_PDL: tl.constexpr, K_MAX: tl.constexpr,
                       BLOCK: tl.constexpr, CHUNKS_PAD: tl.constexpr, K_PAD: tl.constexpr,
                       GROUP: tl.constexpr, GROUPS_PAD: tl.constexpr, CANDIDATES: tl.constexpr):
    """Stage 2, one program per row: merge the row's chunks in a fixed order, write every output."""
    row = tl.program_id(0)
    if HAS_MASK:
        if tl.load(row_mask_ptr + row) == 0:
            return
    row64 = row.to(tl.int64)
    row_ptr = logits_ptr + row64 * row_stride
    token = tl.load(token_ptr + row).to(tl.int64)
    token_ok = (token >= 0) & (token < vocab)
    target = tl.load(row_ptr + tl.where(token_ok, token, 0)).to(tl.float32)
    k = tl.minimum(tl.maximum(tl.load(num_top_ptr + row).to(tl.int32), 0), tl.minimum(vocab, K_MAX))
    if USE_PDL:
        gdc_wait()  # stage 1's writes are visible from here on

    c = tl.arange(0, CHUNKS_PAD)
    stat = row64 * n_chunks + c
    m = tl.load(chunk_max_ptr + stat, mask=c < n_chunks, other=float("-inf"))
    s = tl.load(chunk_sumexp_ptr + stat, mask=c < n_chunks, other=0.0)
    ahead = tl.load(chunk_ahead_ptr + stat, mask=c < n_chunks, other=0)
    if K_MAX > 0:  # loaded early, beside the statistics (unused, so harmless, when k = 0)
        blk = tl.arange(0, GROUPS_PAD)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        block_max = tl.load(block_max_ptr + row64 * n_blocks + blk, mask=blk < n_blocks, other=0.0)

    peak = tl.max(m, axis=0)
    safe_peak = tl.where((peak == float("inf")) | (peak == float("-inf")), 0.0, peak)
    sumexp = tl.sum(s * tl.exp(m - safe_peak), axis=0)
    invalid = (peak == float("inf")) | (peak == float("-inf")) | (sumexp != sumexp)  # +inf, all -inf, NaN
    lse = safe_peak + tl.log(sumexp)
    status = tl.where(invalid, 1, tl.where(token_ok, 0, 2))
    tl.store(status_ptr + row, status.to(tl.int8))
    tl.store(lse_ptr + row, tl.where(invalid, float("nan"), lse))
    tl.store(logprob_ptr + row, tl.where(status == 0, target - lse, float("nan")))
    tl.store(rank_ptr + row, tl.where(status == 0, 1 + tl.sum(ahead, axis=0), -1))

    if K_MAX > 0:
        top = tl.full([K_PAD], KEY_NONE, tl.int64)
        if (k > 0) & (invalid == 0):
            top = _top_k_keys(block_max, blk, row_ptr, candidates_ptr + row64 * (2 * CANDIDATES), k, vocab,
                              n_blocks, BLOCK, GROUPS_PAD, GROUP, K_PAD, CANDIDATES)
        col = tl.arange(0, K_PAD)
        wanted = col < k
        top_ids = tl.where(wanted & (invalid == 0), _key_id(top), -1)
        top_lp = tl.where(wanted, tl.where(invalid, float("nan"), _key_value(top) - lse), float("-inf"))
        out = row64 * K_MAX + col
        tl.store(top_ids_ptr + out, top_ids, mask=col < K_MAX)
        tl.store(top_lp_ptr + out, top_lp, mask=col < K_MAX)


def launch_reduce(logits: torch.Tensor, token_ids: torch.Tensor, num_top: torch.Tensor,
                  row_mask: torch.Tensor | None, out) -> None:
    """Launch both stages into `out` (a LogprobBuffers): no allocation, no host sync."""
    ws = out.workspace
    cfg = ws.config
    n_rows, vocab = logits.shape
    has_mask = row_mask is not None
    mask = row_mask.view(torch.uint8) if has_mask else token_ids  # any pointer when unused
    pdl = bool(cfg.pdl) and logits.is_cuda and not TRITON_INTERPRET
    inputs = (logits, logits.stride(0), token_ids, num_top, mask,
              ws.chunk_max, ws.chunk_sumexp, ws.chunk_ahead, ws.block_max)
    sizes = (vocab, ws.n_chunks, ws.n_blocks)
    common = dict(HAS_MASK=has_mask, USE_PDL=pdl, K_MAX=out.k_max, BLOCK=cfg.block)
    chunk_stats_kernel[(ws.n_chunks, n_rows)](
        *inputs, *sizes, BLOCKS_PER_CHUNK=cfg.chunk // cfg.block, num_warps=cfg.num_warps, **common)
    finish_rows_kernel[(n_rows,)](
        *inputs, ws.candidates, out.logprob, out.rank, out.logsumexp, out.top_ids, out.top_logprobs,
        out.status, *sizes, CHUNKS_PAD=triton.next_power_of_2(ws.n_chunks),
        K_PAD=triton.next_power_of_2(max(out.k_max, 1)), GROUP=cfg.group,
        GROUPS_PAD=triton.next_power_of_2(triton.cdiv(max(ws.n_blocks, 1), cfg.group)),
        CANDIDATES=cfg.candidates, num_warps=cfg.finish_warps,
        **(dict(launch_pdl=True) if pdl else {}), **common)
