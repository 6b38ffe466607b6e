"""Write the new tokens' keys and values into the paged KV cache.

The cache layout is [num_blocks, block_size, num_kv_heads, head_dim]; a token's
slot is block_id * block_size + offset. Padded rows carry slot -1 and must not
write, so a fixed-size (CUDA-graph) batch can include empty rows.
"""
import torch
import triton
import triton.language as tl

from qwen3_runtime.ops import use_triton


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_key_t, stride_key_h, stride_value_t, stride_value_h,
    stride_kc_block, stride_kc_offset, stride_kc_head,
    stride_vc_block, stride_vc_offset, stride_vc_head,
    block_size, head_dim,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    # Not `(offs_d < head_dim) & (slot >= 0)`: the interpreter turns scalar & block into int32.
    mask = offs_d < tl.where(slot >= 0, head_dim, 0)
    # Clamp so a padded row's (masked) addresses stay inside the cache.
    slot = tl.maximum(slot, 0)
    block_id = slot // block_size
    block_offset = slot % block_size

    key = tl.load(key_ptr + token * stride_key_t + head * stride_key_h + offs_d, mask=mask)
    value = tl.load(value_ptr + token * stride_value_t + head * stride_value_h + offs_d, mask=mask)
    k_dst = k_cache_ptr + block_id * stride_kc_block + block_offset * stride_kc_offset + head * stride_kc_head
    v_dst = v_cache_ptr + block_id * stride_vc_block + block_offset * stride_vc_offset + head * stride_vc_head
    tl.store(k_dst + offs_d, key, mask=mask)
    tl.store(v_dst + offs_d, value, mask=mask)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter key/value [T, KVH, D] into the caches at slot_mapping [T]; slot -1 is skipped."""
    if not use_triton(key):
        store_kv_reference(key, value, k_cache, v_cache, slot_mapping)
        return
    num_tokens, num_kv_heads, head_dim = key.shape
    assert k_cache.dtype == key.dtype and v_cache.dtype == value.dtype
    assert key.stride(2) == value.stride(2) == k_cache.stride(3) == v_cache.stride(3) == 1
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens, num_kv_heads)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_cache.shape[1], head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=1,
    )


def store_kv_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Plain PyTorch store_kv: the CPU path and the kernel's oracle."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[valid]
    v_cache[blocks, offsets] = value[valid]
