import functools

import pytest
import torch

from qwen3_runtime.ops import attention_inputs as attention_inputs_module
from qwen3_runtime.ops.attention_inputs import DECODE_ROWS, attention_inputs, attention_inputs_reference

SENTINEL = -12345.0


def _inputs(
    tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int,
    dtype: torch.dtype,
    device: str = "cpu",
    seed: int = 0,
):
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen) * 3).to(dtype).to(device)
    qw, kw = (torch.randn(head_dim, generator=gen).to(dtype).to(device) for _ in range(2))
    angles = torch.rand(64, head_dim // 2, generator=gen) * 6
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
    positions = torch.randint(0, 64, (tokens,), generator=gen).to(device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[::3] = -1  # padded rows
    shape = (num_blocks, block_size, kv_heads, head_dim)
    caches = [torch.full(shape, SENTINEL, dtype=dtype, device=device) for _ in range(2)]
    return qkv, qw, kw, cos_sin, positions.to(device), caches, slots.to(device)


def _expected_cache(cache: torch.Tensor, new: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Slot-by-slot scatter in plain Python, independent of both implementations."""
    expected = cache.clone()
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // cache.shape[1], slot % cache.shape[1]] = new[token]
    return expected


# 7 tokens: a program per (token, head) (tiles with `invariant`); 70: tiles of PREFILL_TILE_TOKENS, the last one
# partial.
@pytest.mark.parametrize("tokens", [7, 70])
@pytest.mark.parametrize("head_dim,block_size", [(24, 8), (32, 16)])
@pytest.mark.parametrize(
    "implementation",
    [attention_inputs, functools.partial(attention_inputs, invariant=True), attention_inputs_reference],
    ids=["triton", "invariant", "reference"],
)
def test_normed_rotated_and_stored_exactly_at_the_mapped_slots(tokens, head_dim, block_size, implementation):
    heads, kv_heads = 4, 2
    qkv, qw, kw, cos_sin, positions, (k_cache, v_cache), slots = _inputs(
        tokens, heads, kv_heads, head_dim, block_size, 12, torch.float32
    )
    q_ref, k_ref, v_ref = attention_inputs_reference(
        qkv, heads, kv_heads, qw, kw, 1e-6, cos_sin, positions, k_cache.clone(), v_cache.clone(), slots
    )
    expected_k, expected_v = _expected_cache(k_cache, k_ref, slots), _expected_cache(v_cache, v_ref, slots)

    q, k, v = implementation(qkv, heads, kv_heads, qw, kw, 1e-6, cos_sin, positions, k_cache, v_cache, slots)

    assert q.shape == (tokens, heads, head_dim) and k.shape == v.shape == (tokens, kv_heads, head_dim)
    torch.testing.assert_close(q, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(v, v_ref)
    # Every cache element is checked: mapped slots hold the new rows, all others keep the sentinel.
    torch.testing.assert_close(k_cache, expected_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(v_cache, expected_v)
    assert (k_cache == SENTINEL).all(dim=(2, 3)).sum() == k_cache.shape[0] * block_size - (slots >= 0).sum()


def test_all_rows_padded_leave_the_cache_untouched():
    qkv, qw, kw, cos_sin, positions, (k_cache, v_cache), slots = _inputs(5, 2, 1, 16, 8, 2, torch.float32)
    attention_inputs(qkv, 2, 1, qw, kw, 1e-6, cos_sin, positions, k_cache, v_cache, torch.full_like(slots, -1))
    assert (k_cache == SENTINEL).all() and (v_cache == SENTINEL).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [33, 301])
def test_bf16_matches_the_reference_on_the_gpu(tokens):
    qkv, qw, kw, cos_sin, positions, caches, slots = _inputs(tokens, 32, 8, 128, 16, 64, torch.bfloat16, "cuda")
    ref_caches = [c.clone() for c in caches]
    ours = attention_inputs(qkv, 32, 8, qw, kw, 1e-6, cos_sin, positions, *caches, slots)
    ref = attention_inputs_reference(qkv, 32, 8, qw, kw, 1e-6, cos_sin, positions, *ref_caches, slots)
    for a, b in zip(list(ours) + caches, list(ref) + ref_caches):
        assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()
    assert torch.equal(caches[1], ref_caches[1])  # v is copied, not computed
    assert torch.equal(caches[0] == SENTINEL, ref_caches[0] == SENTINEL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_invariant_gives_a_token_the_same_bits_among_few_tokens_or_many():
    qkv, qw, kw, cos_sin, positions, caches, slots = _inputs(70, 32, 8, 128, 16, 64, torch.bfloat16, "cuda")
    many = attention_inputs(qkv, 32, 8, qw, kw, 1e-6, cos_sin, positions, *caches, slots, invariant=True)
    few = attention_inputs(
        qkv[3:8].clone(), 32, 8, qw, kw, 1e-6, cos_sin, positions[3:8], *caches, slots[3:8], invariant=True
    )
    for a, b in zip(many[:2], few[:2]):  # q and k
        assert torch.equal(a[3:8], b)


# 1 token; the last decode-sized batch and one past it (tiles of PREFILL_TILE_TOKENS, the last holding one token).
@pytest.mark.parametrize("tokens", [1, DECODE_ROWS, DECODE_ROWS + 1])
def test_q_and_k_are_written_everywhere(monkeypatch, tokens):
    """q and k start as NaN (padded rows included: they are computed, only their cache stores are skipped);
    head_dim 24's half (12) is padded to 16 lanes."""
    empty = torch.empty
    monkeypatch.setattr(attention_inputs_module.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    heads, kv_heads = 2, 1
    qkv, qw, kw, cos_sin, positions, (k_cache, v_cache), slots = _inputs(
        tokens, heads, kv_heads, 24, 8, 12, torch.float32, seed=tokens
    )
    ref_caches = (k_cache.clone(), v_cache.clone())
    q_ref, k_ref, _ = attention_inputs_reference(
        qkv, heads, kv_heads, qw, kw, 1e-6, cos_sin, positions, *ref_caches, slots
    )
    q, k, _ = attention_inputs(qkv, heads, kv_heads, qw, kw, 1e-6, cos_sin, positions, k_cache, v_cache, slots)
    torch.testing.assert_close(q, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache, ref_caches[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(v_cache, ref_caches[1])
