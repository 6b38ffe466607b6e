"""Seeded Gumbel-max sampling in one pass over the processed logits: the reference (sampler.sample_reference)
materialises the [B, V] hash in int64 over about twenty elementwise steps, the float noise, and their sum
before an argmax, all inside the decode graph; here each token's hash, noise and noisy logit live in
registers only.

Stage 1, one program per (row, chunk of the vocabulary), so that a single row still spreads over many SMs:
each token's noise (bit-identical hash to sampler.hash_bits, the same float steps as
sampler.gumbel_from_bits; none on greedy rows), added to its logit, and the chunk's largest sum with its
lowest id (largest_first: NaN counts as the largest value and the first NaN's id wins, as in
torch.argmax). Stage 2 is greedy decoding's own row reduce over the chunks.

With a row transform (peak, min-p, cutoff; sampler.sample_raw), the kernel reads raw logits and forms the
processed value of each token itself, as sampler.processed_logits does: scaled by temperature, -inf below the
min-p floor and, with a cutoff key, for tokens whose order key is below it (top-k and top-p: the kept
tokens are a prefix of the stable descending order, so one key per row says which). Rows flagged in
`write_rows` get those values stored over their row of `write_to` (the raw logits, whose rows their logprobs
are taken from: of the processed distribution); the [B, V] processed tensor is never built for the others.
`processed_values` gives the values the cutoff is selected among.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import TRITON_INTERPRET, greedy, pdl_launch
from qwen3_runtime.ops.greedy import largest_first
from qwen3_runtime.ops.logprob_reduce import order_key

CHUNK = 2048  # smaller than greedy's: the hash is arithmetic per token, and one row wants many programs


@triton.jit
def _mix(h):
    """sampler._mix_ on uint32: the multiplications wrap modulo 2**32, as the reference's masks make them."""
    h ^= h >> 16
    h *= 0x7FEB352D
    h ^= h >> 15
    h *= 0x1B873593
    return h ^ (h >> 16)


@triton.jit
def row_key(seed, position):
    """sampler.hash_bits's per-row key (uint32) from int64 seed and position: the seed's two 32-bit halves
    mixed, then the position's low half."""
    key = _mix(seed.to(tl.uint32) ^ _mix((seed >> 32).to(tl.uint32)))
    return _mix(key ^ position.to(tl.uint32))


@triton.jit
def token_bits(key, ids):
    """sampler.hash_bits for token ids `ids` (int32) of the row with `key`: uint32."""
    return _mix(_mix(key ^ ids.to(tl.uint32)) ^ 0x5BD1E995)


@triton.jit
def gumbel_from_bits(k, NOISE_BITS: tl.constexpr, LIBDEVICE: tl.constexpr):
    """sampler.gumbel_from_bits on k < 2**NOISE_BITS (uint32): u - 1 = (k - (2**23 - 0.5)) / 2**23 exactly,
    E = -log1p(u - 1), noise = -log(E)."""
    half_below_one: tl.constexpr = (1 << NOISE_BITS) - 0.5
    u_minus_1 = (k.to(tl.float32) - half_below_one) * (1.0 / (1 << NOISE_BITS))  # k.to(f32) is exact
    if LIBDEVICE:  # CUDA's log1pf and logf, as torch's on the GPU; tl.log may be approximate there
        return -libdevice.log(-libdevice.log1p(u_minus_1))
    else:  # the interpreter has no libdevice; 1 + (u - 1) = u exactly, and numpy's log is accurate near 1
        return -tl.log(-tl.log(1.0 + u_minus_1))


@triton.jit
def scaling_terms(peak, temperature, min_p, LIBDEVICE: tl.constexpr):
    """sampler._scaling for one row, from its peak (largest raw logit): the shift keeping peak / temperature
    finite, and the min-p floor of the scaled values. IEEE division and CUDA's logf, as torch's."""
    overflows = (tl.abs(peak) < float("inf")) & ~(tl.abs(tl.math.div_rn(peak, temperature)) < float("inf"))
    shift = tl.where(overflows, peak, 0.0)
    log_min_p = libdevice.log(min_p) if LIBDEVICE else tl.log(min_p)
    return shift, tl.math.div_rn(peak - shift, temperature) + log_min_p


@triton.jit
def _processed(x, row, temperature, peak_ptr, min_p_ptr, LIBDEVICE: tl.constexpr):
    """sampler.processed_logits of a random row's raw logits x, the row's terms (scaling_terms) formed here
    from its peak and min-p rather than by a dozen [B] kernels per step: (x - shift) / temperature, -inf below
    the min-p floor. The values are bit-identical to the reference's."""
    shift, floor = scaling_terms(tl.load(peak_ptr + row), temperature, tl.load(min_p_ptr + row), LIBDEVICE)
    return processed_value(x, shift, temperature, floor)


@triton.jit
def processed_value(x, shift, temperature, floor):
    """Raw logits x of a random row as processed, from its terms (scaling_terms): (x - shift) / temperature in
    IEEE division, -inf below the min-p floor."""
    processed = tl.math.div_rn(x - shift, temperature)
    return tl.where(processed < floor, float("-inf"), processed)


@triton.jit
def _processed_kernel(
    logits_ptr, temperature_ptr, peak_ptr, min_p_ptr, out_ptr, vocab, stride_row, greedy_below,
    CHUNK: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    temperature = tl.maximum(tl.load(temperature_ptr + row), greedy_below)  # greedy rows' values go unused
    value = _processed(x, row, temperature, peak_ptr, min_p_ptr, LIBDEVICE)
    # -0.0 as 0.0: a radix sort (CUDA's) would order -0.0 below 0.0, where the order keys tie them.
    tl.store(out_ptr + row * vocab + ids, tl.where(value == 0.0, 0.0, value), mask=ids < vocab)


def processed_values(
    logits: torch.Tensor, temperature: torch.Tensor, peak: torch.Tensor, min_p: torch.Tensor, greedy_below: float
) -> torch.Tensor:
    """[B, V] fp32 processed logits of random rows (`_processed`: scaled by temperature, -inf below min-p; no
    top-k or top-p; -0.0 stored as 0.0) from raw fp32 logits and their row maxima `peak`, in one pass: what the
    top-k / top-p cutoffs are selected among (sampler.filter_cutoffs)."""
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    out = torch.empty(rows, vocab, dtype=torch.float32, device=logits.device)
    if rows:
        _processed_kernel[(rows, triton.cdiv(vocab, CHUNK))](
            logits, temperature, peak, min_p, out, vocab, logits.stride(0), greedy_below, CHUNK=CHUNK,
            LIBDEVICE=not TRITON_INTERPRET,
        )  # fmt: skip
    return out


@triton.jit
def _chunk_kernel(
    logits_ptr,
    temperature_ptr,
    seed_ptr,
    position_ptr,
    peak_ptr,
    min_p_ptr,
    write_ptr,
    cutoff_ptr,
    written_ptr,
    done_ptr,
    noisy_rows_ptr,
    noisy_ptr,
    chunk_max_ptr,
    chunk_id_ptr,
    vocab,
    stride_row,
    stride_written,
    num_chunks,
    greedy_below,
    NOISE_BITS: tl.constexpr,
    CHUNK: tl.constexpr,
    TRANSFORM: tl.constexpr,
    CUTOFF: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    HAS_DONE: tl.constexpr,
    NOISY: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    if HAS_DONE:
        if tl.load(done_ptr + row) != 0:
            return
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    key = row_key(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    noise = gumbel_from_bits(token_bits(key, ids) >> (32 - NOISE_BITS), NOISE_BITS, LIBDEVICE)
    temperature = tl.load(temperature_ptr + row)
    is_random = temperature >= greedy_below
    processed = x
    if TRANSFORM:
        if is_random:
            processed = _processed(x, row, temperature, peak_ptr, min_p_ptr, LIBDEVICE)
            if CUTOFF:
                kept = order_key(processed, ids) >= tl.load(cutoff_ptr + row)
                processed = tl.where(kept, processed, float("-inf"))
            if tl.load(write_ptr + row) != 0:
                tl.store(written_ptr + row * stride_written + ids, processed, mask=ids < vocab)
            if NOISY:
                if tl.load(noisy_rows_ptr + row) != 0:
                    tl.store(noisy_ptr + row * vocab + ids, processed + noise, mask=ids < vocab)
    peak, first = largest_first(tl.where(is_random, processed + noise, x), ids, vocab)
    tl.store(chunk_max_ptr + row * num_chunks + chunk, peak)
    tl.store(chunk_id_ptr + row * num_chunks + chunk, first)
    if USE_PDL:
        gdc_launch_dependents()


def gumbel_sample(
    processed: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    greedy_below: float,
    noise_bits: int,
    transform: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None,
    write_to: torch.Tensor | None = None,
    done: torch.Tensor | None = None,
    tokens: torch.Tensor | None = None,
    noisy: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Token ids [B] int64: argmax over each row of fp32 `processed` [B, V] plus the row's Gumbel noise, or
    of `processed` alone where temperature < greedy_below. Ties go to the lower id; a row holding a NaN
    gets its first NaN's id. `transform` (peak [B] f32: each row's largest logit, min_p [B] f32, write_rows [B]
    int, cutoff [B] int64 or None): `processed` holds raw logits, and random rows sample from their processed
    values (`_processed`), -inf where the token's order key is below cutoff; rows with write_rows != 0 get those
    values written over their row of `write_to` (default: `processed` itself). `done` [B] bool: rows already
    sampled (ops/top_k_sample.py), skipped, their entries of `tokens` (the result, when given) left as they are.
    `noisy` (rows [B] int, out [B, V] f32; with `transform`): random rows with rows != 0 get each token's
    processed value plus its noise stored in `out` (ops/top_p_sample.py draws again among them).
    Allocates only by (B, V): capturable in a CUDA graph."""
    rows, vocab = processed.shape
    assert processed.dtype == torch.float32 and processed.stride(1) == 1 and noise_bits <= 23
    assert seed.dtype == position.dtype == torch.int64 and temperature.dtype == torch.float32
    assert temperature.stride() == seed.stride() == position.stride() == (1,)
    if transform is not None:
        assert all(t.shape == (rows,) and t.stride() == (1,) for t in transform if t is not None)
        assert transform[0].dtype == transform[1].dtype == torch.float32
        assert transform[3] is None or transform[3].dtype == torch.int64
    write_to = processed if write_to is None else write_to
    assert noisy is None or (transform is not None and noisy[1].shape == processed.shape and noisy[1].is_contiguous())
    assert write_to.shape == processed.shape and write_to.dtype == torch.float32 and write_to.stride(1) == 1
    num_chunks, chunk_max, chunk_id = greedy.chunk_buffers(rows, vocab, CHUNK, processed.device)
    if rows:
        _chunk_kernel[(rows, num_chunks)](
            processed,
            temperature,
            seed,
            position,
            *[temperature if t is None else t for t in transform or (None,) * 4],  # unread without TRANSFORM, CUTOFF
            write_to,
            temperature if done is None else done,  # unread without HAS_DONE
            *(noisy or (temperature, temperature)),  # unread without NOISY
            chunk_max,
            chunk_id,
            vocab,
            processed.stride(0),
            write_to.stride(0),
            num_chunks,
            greedy_below,
            NOISE_BITS=noise_bits,
            CHUNK=CHUNK,
            TRANSFORM=transform is not None,
            CUTOFF=transform is not None and transform[3] is not None,
            LIBDEVICE=not TRITON_INTERPRET,
            HAS_DONE=done is not None,
            NOISY=noisy is not None,
            num_warps=4,
            **pdl_launch(processed),
        )
    return greedy.reduce_chunks(chunk_max, chunk_id, vocab, done, tokens)[1]
