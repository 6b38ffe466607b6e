"""Seeded Gumbel-max sampling in one pass over the processed logits: the reference (sampler.sample_reference)
materialises the [B, V] hash in int64 over about twenty elementwise steps, the float noise, and their sum
before an argmax, all inside the decode graph; here each token's hash, noise and noisy logit live in
registers only.

Stage 1, one program per (row, chunk of the vocabulary), so that a single row still spreads over many SMs:
each token's noise (bit-identical hash to sampler.hash_bits, the same float steps as
sampler.gumbel_from_bits; none on greedy rows), added to its logit, and the chunk's largest sum with its
lowest id (largest_first: NaN counts as the largest value and the first NaN's id wins, as in
torch.argmax). Stage 2 is greedy decoding's own row reduce over the chunks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen3_runtime.ops import TRITON_INTERPRET, greedy, pdl_launch
from qwen3_runtime.ops.greedy import largest_first

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
def _chunk_kernel(
    logits_ptr,
    temperature_ptr,
    seed_ptr,
    position_ptr,
    chunk_max_ptr,
    chunk_id_ptr,
    vocab,
    stride_row,
    num_chunks,
    greedy_below,
    NOISE_BITS: tl.constexpr,
    CHUNK: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    key = row_key(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    noise = gumbel_from_bits(token_bits(key, ids) >> (32 - NOISE_BITS), NOISE_BITS, LIBDEVICE)
    is_random = tl.load(temperature_ptr + row) >= greedy_below
    peak, first = largest_first(tl.where(is_random, x + noise, x), ids, vocab)
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
) -> torch.Tensor:
    """Token ids [B] int64: argmax over each row of fp32 `processed` [B, V] plus the row's Gumbel noise, or
    of `processed` alone where temperature < greedy_below. Ties go to the lower id; a row holding a NaN
    gets its first NaN's id. Allocates only by (B, V): capturable in a CUDA graph."""
    rows, vocab = processed.shape
    assert processed.dtype == torch.float32 and processed.stride(1) == 1 and noise_bits <= 23
    assert seed.dtype == position.dtype == torch.int64 and temperature.dtype == torch.float32
    assert temperature.stride() == seed.stride() == position.stride() == (1,)
    num_chunks = triton.cdiv(vocab, CHUNK)
    chunk_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=processed.device)
    chunk_id = torch.empty(rows, num_chunks, dtype=torch.int32, device=processed.device)
    if rows:
        _chunk_kernel[(rows, num_chunks)](
            processed,
            temperature,
            seed,
            position,
            chunk_max,
            chunk_id,
            vocab,
            processed.stride(0),
            num_chunks,
            greedy_below,
            NOISE_BITS=noise_bits,
            CHUNK=CHUNK,
            LIBDEVICE=not TRITON_INTERPRET,
            num_warps=4,
            **pdl_launch(processed),
        )
    return greedy.reduce_chunks(chunk_max, chunk_id, vocab)[1]
