"""Token sampling on the device: greedy, or seeded temperature / top-k / top-p.

Random rows use the Gumbel-max trick with noise that is a pure function of
(request seed, position of the new token, token id): a request's tokens do not
depend on the rest of the batch, and no shared generator state exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device ([B] each)."""

    temperature: torch.Tensor  # f32, 0 = greedy
    top_k: torch.Tensor  # int32, <= 0 = off
    top_p: torch.Tensor  # f32, 1 = off
    seed: torch.Tensor  # int64
    position: torch.Tensor  # int64, position of the token being sampled


def processed_logits(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """What random rows sample from: logits / temperature, -inf outside top-k and top-p.
    Greedy rows (temperature 0) keep their raw logits."""
    scaled = _top_k_top_p(logits / params.temperature.clamp_min(1e-6)[:, None], params.top_k, params.top_p)
    return torch.where((params.temperature > 0)[:, None], scaled, logits)


def sample(processed: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Token ids [B] (int64) from processed logits: Gumbel-max for random rows, argmax for greedy ones."""
    noise = gumbel_noise(params.seed, params.position, processed.shape[-1])
    noise = noise.masked_fill_((params.temperature == 0)[:, None], 0.0)
    return (processed + noise).argmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """-inf outside each row's top-k and outside the smallest prefix holding top_p of the mass."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k.long(), vocab)[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before > top_p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def gumbel_noise(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, vocab] from a counter-based hash of (seed, position, token id)."""
    key = _mix(_mix((seed & _MASK32) ^ _mix(seed >> 32)) ^ (position & _MASK32))
    token = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    bits = _mix(_mix(key[:, None] ^ token[None, :]) ^ 0x5BD1E995)
    uniform = ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))  # in (0, 1)
    return -torch.log(-torch.log(uniform))


def _mix(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mixer in int64 arithmetic; multipliers < 2**31 so nothing overflows."""
    h = h & _MASK32
    h = ((h ^ (h >> 16)) * 0x7FEB352D) & _MASK32
    h = ((h ^ (h >> 15)) * 0x1B873593) & _MASK32
    return h ^ (h >> 16)
