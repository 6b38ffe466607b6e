"""Triton kernels of `reduce_logprobs` (imported lazily: only when Triton runs).

Stage 1, one program per (vocab chunk, row): per-chunk max, sum of exp (NaN if
the chunk holds a NaN or +inf), the count of elements ranked ahead of the
selected token, and (when top-k is asked) the maximum of every BLOCK elements.

Stage 2, one program per row: merges the chunks in a fixed order
(lse = M + log sum s_i exp(m_i - M), the sum by pairs in a fixed tree) and
selects the exact top-k ("ranked ahead" means larger value, then lower id;
-0.0 ties +0.0):

* The top-k elements lie in the top-k blocks by (block max, block id): each
  of those k blocks holds an element ranked above anything in another block.
* k = 1: the first block of largest maximum, then its first largest element.
* Phase 1, the top-k blocks: the k-th largest maximum of groups of GROUP
  blocks is a value that at least k block maxima reach, so only blocks
  reaching it compete (typically k to 1.5k of ~1200); they are compacted
  (prefix sum, this row's scratch) and ranked by counting.
* Phase 2, the top-k elements: gather the k blocks; only elements reaching
  the smallest of their maxima compete (typically about k); they are
  compacted the same way, ranked by counting and stored at their rank.
* If more than CANDIDATES compete in a phase (heavy ties, clustered values),
  k rounds of max over unique int64 order keys give the same answer, slower.

No atomics, and each row's arithmetic depends only on that row and the
config: results are bitwise reproducible and independent of N (and of k_max).
With PDL (programmatic dependent launch, Hopper) stage 2 is launched while
stage 1 runs, and (pdl_first) stage 1 is launched while the kernel before it
finishes; each waits for the kernel before it before its first load.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import TRITON_INTERPRET

KEY_NONE = tl.constexpr(-0x7FFFFFFFFFFFFFFF)  # below every real key
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def order_key(x, ids):
    """Unique int64 key: larger means larger value, then lower id (-0.0 ties +0.0); the sampler's cutoffs are
    such keys too (order_keys.py: the PyTorch twin)."""
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
def _top_by_rounds(keys, k, K_PAD: tl.constexpr):
    """The k largest keys of a 1-D tile, one max per round: the exact fallback for many candidates."""
    pos = tl.arange(0, K_PAD)
    top = tl.full([K_PAD], KEY_NONE, tl.int64)
    for i in range(k):
        best = tl.max(keys, axis=0)
        top = tl.where(pos == i, best, top)
        keys = tl.where(keys == best, KEY_NONE, keys)
    return top


@triton.jit
def _kth_largest_value(v, k):
    """The k-th largest of a 1-D tile of values, counted with multiplicity."""
    ahead = tl.sum((v[None, :] > v[:, None]).to(tl.int32), axis=1)
    return tl.min(tl.where(ahead < k, v, float("inf")), axis=0)


@triton.jit
def _ranks(v, ids, valid):
    """For each valid (value, id) pair of 1-D tiles, how many valid pairs rank ahead of it (larger
    value, then lower id); the tile size for the others. Floats compare -0.0 equal to +0.0."""
    beats = (v[None, :] > v[:, None]) | ((v[None, :] == v[:, None]) & (ids[None, :] < ids[:, None]))
    ahead = tl.sum((beats & valid[None, :]).to(tl.int32), axis=1)
    return tl.where(valid, ahead, v.shape[0])


@triton.jit
def _compact(chosen, v, ids, n, scratch_ptr, C: tl.constexpr):
    """The n (<= C) chosen (value, id) pairs of 2-D tiles as [C] tiles (with their validity), in
    tile order, through this row's scratch (values at [0, C), ids at [C, 2C))."""
    size: tl.constexpr = chosen.shape[0] * chosen.shape[1]
    slot = tl.reshape(tl.cumsum(tl.reshape(chosen.to(tl.int32), [size]), axis=0), chosen.shape) - 1
    tl.store(scratch_ptr + slot, v.to(tl.int32, bitcast=True), mask=chosen)
    tl.store(scratch_ptr + C + slot, ids, mask=chosen)
    tl.debug_barrier()
    i = tl.arange(0, C)
    cv = tl.load(scratch_ptr + i, mask=i < n, other=0).to(tl.float32, bitcast=True)
    cid = tl.load(scratch_ptr + C + i, mask=i < n, other=0)
    return cv, cid, i < n


@triton.jit
def _top_k_store(block_max, blk, row_ptr, scratch_ptr, k, vocab, n_blocks, lse, ids_out, lp_out,
                 BLOCK: tl.constexpr, GROUPS_PAD: tl.constexpr, GROUP: tl.constexpr,
                 K_PAD: tl.constexpr, C: tl.constexpr):  # fmt: skip
    """Store the row's k (>= 1) largest elements at ids_out / lp_out[0, k), value descending, id ascending.

    `block_max` is the [GROUPS_PAD, GROUP] tile of block maxima, `blk` their block ids.
    """
    real = blk < n_blocks
    block_max = tl.where(real, block_max, float("-inf"))
    if K_PAD == 1:  # k = 1: the first block of largest maximum, then its first largest element
        best = tl.max(tl.max(block_max, axis=1), axis=0)
        first = tl.min(tl.min(tl.where(real & (block_max == best), blk, n_blocks), axis=1), axis=0)
        ids = first * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
        best = tl.max(x, axis=0)
        tl.store(ids_out, tl.min(tl.where((ids < vocab) & (x == best), ids, vocab), axis=0))
        tl.store(lp_out, tl.where(best == 0.0, 0.0, best) - lse)
    else:
        _top_k_store_many(block_max, blk, real, row_ptr, scratch_ptr, k, vocab, lse, ids_out, lp_out,
                          BLOCK, GROUPS_PAD, GROUP, K_PAD, C)  # fmt: skip


@triton.jit
def _top_k_store_many(block_max, blk, real, row_ptr, scratch_ptr, k, vocab, lse, ids_out, lp_out,
                      BLOCK: tl.constexpr, GROUPS_PAD: tl.constexpr, GROUP: tl.constexpr,
                      K_PAD: tl.constexpr, C: tl.constexpr):  # fmt: skip
    pos = tl.arange(0, K_PAD)
    top_v, top_id = top_k_sorted(block_max, blk, real, row_ptr, scratch_ptr, k, vocab, 0.0, 1.0,
                                 BLOCK, GROUPS_PAD, GROUP, K_PAD, C, False)  # fmt: skip
    tl.store(ids_out + pos, top_id, mask=pos < k)
    tl.store(lp_out + pos, top_v - lse, mask=pos < k)


@triton.jit
def top_k_sorted(block_max, blk, real, row_ptr, scratch_ptr, k, vocab, shift, temperature,
                 BLOCK: tl.constexpr, GROUPS_PAD: tl.constexpr, GROUP: tl.constexpr,
                 K_PAD: tl.constexpr, C: tl.constexpr, SCALED: tl.constexpr):  # fmt: skip
    """The row's k (1 <= k <= K_PAD) largest elements as [K_PAD] tiles (values, ids), value descending, id
    ascending, -inf and -1 from k on. `block_max` [GROUPS_PAD, GROUP] holds the maxima of the row's blocks
    (`blk` their ids; `real` where they exist) of the values ranked. SCALED: those values are the row's
    elements as (x - shift) / temperature (IEEE division: monotonic, so a block's scaled maximum is its
    scaled maximum element), the sampler's processed logits before min-p."""
    pos = tl.arange(0, K_PAD)
    # Phase 1: the k blocks of largest (maximum, -block id), and t2, the smallest of their maxima.
    t1 = _kth_largest_value(tl.max(block_max, axis=1), k)
    t1 = tl.where(k > GROUPS_PAD, float("-inf"), t1)  # fewer groups than k: every block competes
    chosen = real & (block_max >= t1)
    n1 = tl.sum(tl.sum(chosen.to(tl.int32), axis=1), axis=0)
    top_blk = tl.full([K_PAD], -1, tl.int32)
    t2 = float("-inf")
    if n1 <= C:
        cv, cid, valid = _compact(chosen, block_max, blk, n1, scratch_ptr, C)
        rank = _ranks(cv, cid, valid)
        top_blk = tl.max(tl.where(rank[None, :] == pos[:, None], cid[None, :], -1), axis=1)
        t2 = tl.min(tl.where(rank < k, cv, float("inf")), axis=0)
    else:
        keys = tl.where(real, order_key(block_max, blk), KEY_NONE)
        top_keys = _top_by_rounds(tl.reshape(keys, [GROUPS_PAD * GROUP]), k, K_PAD)
        top_blk = tl.where(top_keys != KEY_NONE, _key_id(top_keys), -1)
        t2 = tl.min(tl.where(top_keys != KEY_NONE, _key_value(top_keys), float("inf")), axis=0)
    use = (pos < k) & (top_blk >= 0)
    t2 = tl.where(tl.sum(use.to(tl.int32), axis=0) < k, float("-inf"), t2)  # fewer blocks than k: all compete

    # Phase 2: the elements of those blocks reaching t2 (every top-k element does).
    ids = tl.where(use, top_blk, 0)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    present = use[:, None] & (ids < vocab)
    x = tl.load(row_ptr + ids, mask=present, other=float("-inf")).to(tl.float32)
    if SCALED:
        x = tl.math.div_rn(x - shift, temperature)
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties +0.0
    chosen = present & (x >= t2)
    n2 = tl.sum(tl.sum(chosen.to(tl.int32), axis=1), axis=0)
    if n2 <= C:
        cv, cid, valid = _compact(chosen, x, ids, n2, scratch_ptr + 2 * C, C)
        at = (_ranks(cv, cid, valid)[None, :] == pos[:, None]) & (pos < k)[:, None]  # [K_PAD, C]: by rank
        top_v = tl.max(tl.where(at, cv[None, :], float("-inf")), axis=1)
        top_id = tl.max(tl.where(at, cid[None, :], -1), axis=1)
    else:
        keys = tl.where(present, order_key(x, ids), KEY_NONE)
        top_keys = _top_by_rounds(tl.reshape(keys, [K_PAD * BLOCK]), k, K_PAD)
        found = (pos < k) & (top_keys != KEY_NONE)
        top_v = tl.where(found, _key_value(top_keys), float("-inf"))
        top_id = tl.where(found, _key_id(top_keys), -1)
    return top_v, top_id


@triton.jit
def _pairwise_sum(x, LOG_N: tl.constexpr):
    """Sum of a 1-D tile of 2**LOG_N by pairs in a fixed tree: the same bits whatever the layout."""
    for _ in tl.static_range(LOG_N):
        x = tl.sum(tl.reshape(x, [x.shape[0] // 2, 2]), axis=1)
    return tl.sum(x, axis=0)


@triton.jit
def _finish_row(row, row64, token_ok, target, chunk_max_ptr, chunk_sumexp_ptr, chunk_ahead_ptr, n_chunks,
                logprob_ptr, rank_ptr, lse_ptr, status_ptr,
                CHUNKS_PAD: tl.constexpr, LOG_CHUNKS: tl.constexpr):  # fmt: skip
    """Merge the row's chunk statistics in a fixed order; store status, logsumexp, logprob and rank.
    Returns (lse, invalid)."""
    c = tl.arange(0, CHUNKS_PAD)
    stat = row64 * n_chunks + c
    m = tl.load(chunk_max_ptr + stat, mask=c < n_chunks, other=float("-inf"))
    s = tl.load(chunk_sumexp_ptr + stat, mask=c < n_chunks, other=0.0)
    ahead = tl.load(chunk_ahead_ptr + stat, mask=c < n_chunks, other=0)
    peak = tl.max(m, axis=0)
    safe_peak = tl.where((peak == float("inf")) | (peak == float("-inf")), 0.0, peak)
    sumexp = _pairwise_sum(s * tl.exp(m - safe_peak), LOG_CHUNKS)
    invalid = (peak == float("inf")) | (peak == float("-inf")) | (sumexp != sumexp)  # +inf, all -inf, NaN
    lse = safe_peak + tl.log(sumexp)
    status = tl.where(invalid, 1, tl.where(token_ok, 0, 2))
    tl.store(status_ptr + row, status.to(tl.int8))
    tl.store(lse_ptr + row, tl.where(invalid, float("nan"), lse))
    tl.store(logprob_ptr + row, tl.where(status == 0, target - lse, float("nan")))
    tl.store(rank_ptr + row, tl.where(status == 0, 1 + tl.sum(ahead, axis=0), -1))
    return lse, invalid


@triton.jit
def _row_and_token(logits_ptr, row_stride, token_ptr, row, vocab):
    """The row's index (int64), its logits, its selected token and whether that token lies in [0, vocab)."""
    row64 = row.to(tl.int64)
    row_ptr = logits_ptr + row64 * row_stride
    token = tl.load(token_ptr + row)
    return row64, row_ptr, token, (token >= 0) & (token < vocab)


@triton.jit
def chunk_stats_kernel(logits_ptr, row_stride, token_ptr, num_top_ptr, row_mask_ptr,
                       chunk_max_ptr, chunk_sumexp_ptr, chunk_ahead_ptr, block_max_ptr,
                       vocab, n_chunks, n_blocks,
                       HAS_MASK: tl.constexpr, USE_PDL: tl.constexpr, WAIT_PRIOR: tl.constexpr,
                       K_MAX: tl.constexpr, BLOCK: tl.constexpr, BLOCKS_PER_CHUNK: tl.constexpr):  # fmt: skip
    """Stage 1, one program per (chunk, row)."""
    if USE_PDL:
        gdc_launch_dependents()  # stage 2 may start launching; it waits for this grid's results
    if WAIT_PRIOR:
        gdc_wait()  # launched early (PDL): the previous kernel's results are visible from here on
    chunk = tl.program_id(0)
    row = tl.program_id(1)
    if HAS_MASK:
        if tl.load(row_mask_ptr + row) == 0:
            return
    row64, row_ptr, token, token_ok = _row_and_token(logits_ptr, row_stride, token_ptr, row, vocab)
    token = tl.where(token_ok, token, 0).to(tl.int32)  # a bad token's rank is unused
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
                       chunk_max_ptr, chunk_sumexp_ptr, chunk_ahead_ptr, block_max_ptr, scratch_ptr,
                       logprob_ptr, rank_ptr, lse_ptr, top_ids_ptr, top_lp_ptr, status_ptr,
                       vocab, n_chunks, n_blocks,
                       HAS_MASK: tl.constexpr, USE_PDL: tl.constexpr, K_MAX: tl.constexpr,
                       BLOCK: tl.constexpr, CHUNKS_PAD: tl.constexpr, LOG_CHUNKS: tl.constexpr, K_PAD: tl.constexpr,
                       GROUP: tl.constexpr, GROUPS_PAD: tl.constexpr, CANDIDATES: tl.constexpr,
                       SCRATCH: tl.constexpr):  # fmt: skip
    """Stage 2, one program per row: merge the row's chunks in a fixed order, write every output."""
    if USE_PDL:
        gdc_launch_dependents()  # the next call's stage 1 (pdl_first) may start; it waits for this grid
        # Before any load, even of inputs stage 1 did not write: stage 1 triggers this launch as it
        # starts, possibly before the kernel it waits for (the logits' producer) has finished.
        gdc_wait()
    row = tl.program_id(0)
    if HAS_MASK:
        if tl.load(row_mask_ptr + row) == 0:
            return
    row64, row_ptr, token, token_ok = _row_and_token(logits_ptr, row_stride, token_ptr, row, vocab)
    token = token.to(tl.int64)
    target = tl.load(row_ptr + tl.where(token_ok, token, 0)).to(tl.float32)
    k = tl.minimum(tl.maximum(tl.load(num_top_ptr + row).to(tl.int32), 0), tl.minimum(vocab, K_MAX))

    if K_MAX > 0:  # loaded first, beside the statistics (unused, so harmless, when k = 0)
        blk = tl.arange(0, GROUPS_PAD)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        block_max = tl.load(block_max_ptr + row64 * n_blocks + blk, mask=blk < n_blocks, other=0.0)
    lse, invalid = _finish_row(row, row64, token_ok, target, chunk_max_ptr, chunk_sumexp_ptr, chunk_ahead_ptr,
                               n_chunks, logprob_ptr, rank_ptr, lse_ptr, status_ptr,
                               CHUNKS_PAD, LOG_CHUNKS)  # fmt: skip

    if K_MAX > 0:
        col = tl.arange(0, K_PAD)
        out = row64 * K_MAX + col
        skip = (k <= 0) | invalid
        rest = (col < K_MAX) & (col >= tl.where(skip, 0, k))  # the columns not stored by rank
        tl.store(top_ids_ptr + out, tl.full([K_PAD], -1, tl.int32), mask=rest)
        tl.store(top_lp_ptr + out, tl.where(col < k, float("nan"), float("-inf")), mask=rest)
        if not skip:
            _top_k_store(
                block_max,
                blk,
                row_ptr,
                scratch_ptr + row64 * SCRATCH,
                k,
                vocab,
                n_blocks,
                lse,
                top_ids_ptr + row64 * K_MAX,
                top_lp_ptr + row64 * K_MAX,
                BLOCK,
                GROUPS_PAD,
                GROUP,
                K_PAD,
                CANDIDATES,
            )


def launch_reduce(
    logits: torch.Tensor, token_ids: torch.Tensor, num_top: torch.Tensor, row_mask: torch.Tensor | None, out
) -> None:
    """Launch both stages into `out` (a LogprobBuffers): no allocation, no host sync."""
    ws = out.workspace
    cfg = ws.config
    n_rows, vocab = logits.shape
    k_max = out.k_max
    has_mask = row_mask is not None
    mask = token_ids  # any pointer when unused
    if has_mask:
        mask = row_mask.view(torch.uint8) if row_mask.dtype == torch.bool else row_mask
    pdl = bool(cfg.pdl) and logits.is_cuda and not TRITON_INTERPRET
    pdl_first = pdl and bool(cfg.pdl_first)
    inputs = (
        logits,
        logits.stride(0),
        token_ids,
        num_top,
        mask,
        ws.chunk_max,
        ws.chunk_sumexp,
        ws.chunk_ahead,
        ws.block_max,
    )
    sizes = (vocab, ws.n_chunks, ws.n_blocks)
    common = dict(HAS_MASK=has_mask, USE_PDL=pdl, K_MAX=k_max, BLOCK=cfg.block)
    chunk_stats_kernel[(ws.n_chunks, n_rows)](
        *inputs,
        *sizes,
        WAIT_PRIOR=pdl_first,
        BLOCKS_PER_CHUNK=cfg.chunk // cfg.block,
        num_warps=cfg.num_warps,
        **(dict(launch_pdl=True) if pdl_first else {}),
        **common,
    )
    chunks_pad = triton.next_power_of_2(ws.n_chunks)
    k_pad = triton.next_power_of_2(max(k_max, 1))
    finish_rows_kernel[(n_rows,)](
        *inputs,
        ws.scratch,
        out.logprob,
        out.rank,
        out.logsumexp,
        out.top_ids,
        out.top_logprobs,
        out.status,
        *sizes,
        CHUNKS_PAD=chunks_pad,
        LOG_CHUNKS=chunks_pad.bit_length() - 1,
        K_PAD=k_pad,
        GROUP=cfg.group,
        GROUPS_PAD=triton.next_power_of_2(triton.cdiv(max(ws.n_blocks, 1), cfg.group)),
        CANDIDATES=min(cfg.candidates, max(16, 4 * k_pad)),
        SCRATCH=ws.scratch.shape[1],
        num_warps=cfg.finish_warps,
        **(dict(launch_pdl=True) if pdl else {}),
        **common,
    )
