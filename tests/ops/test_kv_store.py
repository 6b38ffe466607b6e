import pytest
import torch

from qwen3_runtime.ops.kv_store import store_kv, store_kv_reference

SENTINEL = -12345.0


def _expected_cache(cache: torch.Tensor, new: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Slot-by-slot scatter in plain Python, independent of both implementations."""
    expected = cache.clone()
    block_size = cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            expected[slot // block_size, slot % block_size] = new[token]
    return expected


def _make_inputs(block_size: int, slot_dtype: torch.dtype, dtype: torch.dtype, generator: torch.Generator):
    num_blocks, num_kv_heads, head_dim, num_tokens, num_q_heads = 5, 2, 16, 11, 4
    # Keys and values as strided views into a fused qkv output, as the model produces them.
    qkv = torch.randn(num_tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, generator=generator).to(dtype)
    k_start, v_start = num_q_heads * head_dim, (num_q_heads + num_kv_heads) * head_dim
    key = qkv[:, k_start:v_start].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, v_start:].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slots[[2, 7]] = -1  # padded rows
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, SENTINEL, dtype=dtype)
    v_cache = torch.full(cache_shape, SENTINEL, dtype=dtype)
    return key, value, k_cache, v_cache, slots.to(slot_dtype)


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("implementation", [store_kv, store_kv_reference])
def test_store_kv_writes_exactly_the_mapped_slots(block_size, slot_dtype, dtype, implementation):
    generator = torch.Generator().manual_seed(block_size)
    key, value, k_cache, v_cache, slots = _make_inputs(block_size, slot_dtype, dtype, generator)
    expected_k = _expected_cache(k_cache, key, slots)
    expected_v = _expected_cache(v_cache, value, slots)

    implementation(key, value, k_cache, v_cache, slots)

    # Every element is checked: stored slots hold the new rows, all others keep the sentinel.
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
    untouched = (k_cache == SENTINEL).all(dim=(2, 3)).sum().item()
    assert untouched == k_cache.shape[0] * block_size - (slots >= 0).sum().item()


def test_store_kv_all_rows_padded_changes_nothing():
    generator = torch.Generator().manual_seed(0)
    key, value, k_cache, v_cache, slots = _make_inputs(16, torch.int32, torch.float32, generator)
    store_kv(key, value, k_cache, v_cache, torch.full_like(slots, -1))
    assert (k_cache == SENTINEL).all() and (v_cache == SENTINEL).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_store_kv_matches_reference_on_gpu():
    generator = torch.Generator().manual_seed(0)
    num_blocks, block_size, num_kv_heads, head_dim, num_tokens = 512, 16, 8, 128, 64
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).bfloat16().cuda()
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).bfloat16().cuda()
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slots[::5] = -1
    slots = slots.cuda()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, SENTINEL, dtype=torch.bfloat16, device="cuda") for _ in range(4)]

    store_kv(key, value, caches[0], caches[1], slots)
    store_kv_reference(key, value, caches[2], caches[3], slots)

    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
