"""Token sampling on the device: greedy, or seeded temperature / min-p / top-k / top-p.

Random rows use the Gumbel-max trick with noise that is a pure function of
(request seed, position of the new token, token id): a request's tokens do not
depend on the rest of the batch, and no shared generator state exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen3_runtime.ops import use_triton
from qwen3_runtime.ops.gumbel_sample import gumbel_sample, processed_values
from qwen3_runtime.ops.kept_prefix import filter_sorted, kept_prefix
from qwen3_runtime.ops.top_k_sample import top_k_candidates
from qwen3_runtime.ops.top_p_sample import top_p_reject, top_p_reject_reference
from qwen3_runtime.order_keys import order_key, order_keys_reference, top_ids
from qwen3_runtime.params import GREEDY_BELOW

_MASK32 = 0xFFFFFFFF
# Hash bits per uniform: (k + 0.5) / 2**23 is exact in float32 for every k < 2**23, never 0 or 1.
NOISE_BITS = 23


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device ([B] each)."""

    temperature: torch.Tensor  # f32, < GREEDY_BELOW (0 in practice) = greedy
    top_k: torch.Tensor  # int32, <= 0 = off
    top_p: torch.Tensor  # f32, >= 1 = off
    seed: torch.Tensor  # int64
    position: torch.Tensor  # int64, position of the token being sampled
    min_p: torch.Tensor  # f32, 0 = off


def random_rows(params: SamplingTensors) -> torch.Tensor:
    """[B] bool: rows sampled at random; the rest (temperature < GREEDY_BELOW) take the argmax of raw logits."""
    return params.temperature >= GREEDY_BELOW


def processed_logits(
    logits: torch.Tensor, params: SamplingTensors, peak: torch.Tensor | None = None, filtered: bool = True
) -> torch.Tensor:
    """What random rows sample from, in PyTorch with a full sort (the reference sample_raw is held to):
    logits / temperature, -inf below min-p and outside top-k and top-p (vLLM's order). Greedy rows (temperature
    < GREEDY_BELOW) keep their logits. A row whose largest logit (`peak` [B], when the caller has it) would
    overflow when scaled is shifted by it first (the same distribution, but finite). filtered=False, from a
    caller that knows no random row asks for top-k or top-p, skips the sort, which would change nothing."""
    temperature, shift, floor = _scaling(params, logits.amax(dim=-1) if peak is None else peak)
    scaled = (logits - shift[:, None]) / temperature[:, None]
    scaled = scaled.masked_fill(scaled < floor[:, None], float("-inf"))
    if filtered:
        scaled = _top_k_top_p(scaled, params.top_k, params.top_p)
    return torch.where(random_rows(params)[:, None], scaled, logits)


def sample_raw(
    logits: torch.Tensor,
    params: SamplingTensors,
    peak: torch.Tensor,
    write_rows: torch.Tensor,
    cutoff: torch.Tensor | None = None,
    write_to: torch.Tensor | None = None,
) -> torch.Tensor:
    """sample(processed_logits(logits, params, peak), params) without building the processed logits: on the GPU
    one pass forms each token's processed value, its noise and the argmax. `cutoff` (filter_cutoffs; None for a
    batch without top-k or top-p) says which tokens top-k and top-p keep. Random rows with write_rows != 0 get
    their processed logits written over their row of `write_to` (default `logits`)."""
    write_to = logits if write_to is None else write_to
    if use_triton(logits):
        transform = (peak, params.min_p, write_rows, cutoff)
        return gumbel_sample(
            logits, params.temperature, params.seed, params.position, GREEDY_BELOW, NOISE_BITS, transform, write_to
        )
    processed = processed_logits(logits, params, peak, filtered=False)
    if cutoff is not None:
        kept = (order_keys_reference(processed) >= cutoff[:, None]) | ~random_rows(params)[:, None]
        processed = processed.masked_fill(~kept, float("-inf"))
    _write(processed, params, write_rows, write_to)
    return sample_reference(processed, params)


def sample_selected(
    logits: torch.Tensor, params: SamplingTensors, write_rows: torch.Tensor, write_to: torch.Tensor, cap: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(peak [B]: each row's largest logit, tokens [B]) as sample_raw(logits, params, peak, write_rows,
    filter_cutoffs(...), write_to) gives them, for a batch whose random rows ask 0 < top_k <= cap, or top-p alone
    without their processed logits written, or neither. On the GPU no row sorts: the top-k rows sample among
    their k candidates (ops/top_k_sample.py), the full pass samples the other random rows, and the rows asking
    top-p alone are drawn again among the tokens it keeps (ops/top_p_sample.py). Nor on the CPU
    (_sample_selected_reference)."""
    if not use_triton(logits):
        return _sample_selected_reference(logits, params, write_rows, write_to)
    peak, tokens, cutoff, done, top_p_rows = top_k_candidates(
        logits, params.temperature, params.top_k, params.top_p, params.min_p, params.seed, params.position,
        write_rows, GREEDY_BELOW, NOISE_BITS, cap,
    )  # fmt: skip
    transform = (peak, params.min_p, write_rows, cutoff)
    noisy = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    gumbel_sample(
        logits, params.temperature, params.seed, params.position, GREEDY_BELOW, NOISE_BITS, transform, write_to,
        done, tokens, (top_p_rows, noisy),
    )  # fmt: skip
    top_p_reject(logits, noisy, top_p_rows, params.temperature, peak, params.min_p, params.top_p, tokens)
    return peak, tokens


def _sample_selected_reference(
    logits: torch.Tensor, params: SamplingTensors, write_rows: torch.Tensor, write_to: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_selected in PyTorch, with no sort either: each top-k row keeps what top-k then top-p keep of its k
    largest processed logits (order_keys.top_ids: exactly the sort's first k), one pass samples every row, then
    the rounds of ops/top_p_sample.py draw again the rows asking top-p alone. As on the GPU, a row holding a NaN is
    not filtered (its request fails by its status)."""
    peak = logits.amax(dim=-1)
    processed = processed_logits(logits, params, peak, filtered=False)
    for row in (random_rows(params) & (params.top_k > 0) & ~peak.isnan()).nonzero()[:, 0].tolist():
        _keep_top_k(processed[row], params.top_k[row : row + 1], params.top_p[row : row + 1])
    _write(processed, params, write_rows, write_to)
    noisy = noisy_logits(processed, params)
    tokens = noisy.argmax(dim=-1)
    top_p_rows = random_rows(params) & (params.top_k <= 0) & (params.top_p < 1) & (write_rows == 0) & peak.isfinite()
    top_p_reject_reference(processed, noisy, top_p_rows, params.top_p, tokens)
    return peak, tokens


def _keep_top_k(values: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    """In place on one row's processed values [V]: -inf but for the prefix of the stable descending order that
    top_k [1] (> 0) then top_p [1] keep, counted by ops/kept_prefix.py over the top-k as filter_cutoffs counts it
    over the sorted row (top-p's mass is the top-k's either way)."""
    ids = top_ids(values, min(int(top_k), values.numel()))
    kept = ids[: int(kept_prefix(values[ids][None], top_k, top_p))]
    kept_values = values[kept]
    values.fill_(float("-inf"))
    values[kept] = kept_values


def filter_cutoffs(logits: torch.Tensor, params: SamplingTensors, peak: torch.Tensor) -> torch.Tensor:
    """[B] int64: per random row, the order key (order_keys_reference) of the last token that top-k then top-p
    keep in the stable descending order of its processed logits, so that they keep exactly the tokens whose keys
    are >= it; the smallest key for rows with neither filter, the largest where nothing is kept. The row's values
    are sorted (stably: ties in id order, as the keys rank them), as on the GPU, for a top-k above the selection's
    cap or a top-p cutoff written with the processed logits; what top-k then top-p keep of that order is counted
    by ops/kept_prefix.py (the probabilities summed in float64)."""
    if use_triton(logits):
        values = processed_values(logits, params.temperature, peak, params.min_p, GREEDY_BELOW)
    else:
        values = processed_logits(logits, params, peak, filtered=False)
    top, ids = values.sort(dim=-1, descending=True, stable=True)
    kept = kept_prefix(top, params.top_k, params.top_p)
    place = (kept - 1).clamp_min(0)[:, None]
    last_kept = order_key(top.gather(-1, place)[:, 0], ids.gather(-1, place)[:, 0])
    cutoff = torch.where(kept > 0, last_kept, torch.iinfo(torch.int64).max)
    return torch.where((params.top_k > 0) | (params.top_p < 1), cutoff, torch.iinfo(torch.int64).min)


def _write(processed: torch.Tensor, params: SamplingTensors, write_rows: torch.Tensor, write_to: torch.Tensor) -> None:
    """Random rows with write_rows != 0 get their processed logits written over their row of `write_to`."""
    rows = ((write_rows != 0) & random_rows(params)).nonzero()[:, 0]
    write_to[rows] = processed[rows]


def _scaling(params: SamplingTensors, peak: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row [B]: the temperature (clamped), the shift that keeps a row whose peak / temperature overflows
    finite (the same distribution), and the min-p floor of the scaled values. Scaling is monotonic, so the
    scaled row's largest value is the scaled peak: a probability below min_p times the largest one is a scaled
    logit below the largest plus log(min_p), and min-p needs no second reduction."""
    temperature = params.temperature.clamp_min(GREEDY_BELOW)
    shift = torch.where(peak.isfinite() & ~(peak / temperature).isfinite(), peak, 0.0)
    return temperature, shift, (peak - shift) / temperature + params.min_p.log()


def sample(processed: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Token ids [B] (int64) from processed logits: Gumbel-max for random rows, argmax for greedy ones
    (ties: the lower id; a row holding a NaN: its first NaN's id). One fused pass per row on the GPU
    (ops/gumbel_sample.py), the same tokens as `sample_reference` but for near-ties of logit + noise."""
    if use_triton(processed):
        return gumbel_sample(processed, params.temperature, params.seed, params.position, GREEDY_BELOW, NOISE_BITS)
    return sample_reference(processed, params)


def sample_reference(processed: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """`sample` in PyTorch: the [B, V] hash and noise materialised, then an argmax."""
    return noisy_logits(processed, params).argmax(dim=-1)


def noisy_logits(processed: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """[B, V] what `sample` takes the argmax of: processed logits plus Gumbel noise on random rows."""
    noise = gumbel_noise(params.seed, params.position, processed.shape[-1])
    noise.masked_fill_(~random_rows(params)[:, None], 0.0)
    return noise.add_(processed)


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """-inf outside each row's top-k and outside the smallest prefix holding top_p of the mass (filter_sorted)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    return torch.full_like(logits, float("-inf")).scatter(-1, order, filter_sorted(sorted_logits, top_k, top_p))


def gumbel_noise(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, vocab] from a counter-based hash of (seed, position, token id)."""
    return gumbel_from_bits(hash_bits(seed, position, vocab) >> (32 - NOISE_BITS))


def hash_bits(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] int64 in [0, 2**32): a hash of (seed, position, token id). The [B, vocab] steps
    run in place: on the CPU allocating each intermediate costs more than the arithmetic."""
    key = _mix((seed & _MASK32) ^ _mix(seed >> 32)).bitwise_xor_(position & _MASK32)
    key = _mix(key)
    token = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    bits = key[:, None] ^ token[None, :]
    scratch = torch.empty_like(bits)
    return _mix_(_mix_(bits, scratch).bitwise_xor_(0x5BD1E995), scratch)


def gumbel_from_bits(k: torch.Tensor) -> torch.Tensor:
    """Gumbel noise from k in [0, 2**NOISE_BITS) (int64), finite for every k: with u = (k + 0.5) / 2**23
    in [2**-24, 1 - 2**-24], E = -log(u) is taken as -log1p(u - 1) (u - 1 is exact), so E > 0 even where
    an inexact log would round log(u) to 0 for u next to 1; the noise is -log(E)."""
    half_below_one = float((1 << NOISE_BITS) - 0.5)  # exact: u - 1 = (k - half_below_one) / 2**23
    e = k.float().sub_(half_below_one).mul_(1.0 / (1 << NOISE_BITS)).log1p_().neg_()
    return e.log_().neg_()


def _mix(h: torch.Tensor) -> torch.Tensor:
    """_mix_ on a copy."""
    return _mix_(h.clone(), torch.empty_like(h))


def _mix_(h: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mixer, in place on int64 h (scratch: same shape, for the shifted copies);
    multipliers < 2**31, so nothing overflows int64."""
    h.bitwise_and_(_MASK32)
    h.bitwise_xor_(torch.bitwise_right_shift(h, 16, out=scratch)).mul_(0x7FEB352D).bitwise_and_(_MASK32)
    h.bitwise_xor_(torch.bitwise_right_shift(h, 15, out=scratch)).mul_(0x1B873593).bitwise_and_(_MASK32)
    return h.bitwise_xor_(torch.bitwise_right_shift(h, 16, out=scratch))
