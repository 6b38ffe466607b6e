import pytest
import torch

from qwen3_runtime.ops.prefill_attention import prefill_attention


def _causal_attention_float64(q, k, v, cu_seqlens, scale):
    """Naive per-sequence, per-head causal softmax attention in float64."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group_size = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        for head in range(num_heads):
            for i in range(start, end):
                keys = k[start : i + 1, head // group_size].double()
                values = v[start : i + 1, head // group_size].double()
                scores = keys @ q[i, head].double() * scale
                weights = torch.exp(scores - scores.max())
                out[i, head] = (weights / weights.sum()) @ values
    return out


@pytest.mark.parametrize("num_kv_heads, group_size", [(1, 1), (2, 2), (2, 4), (1, 8)])
def test_prefill_matches_causal_float64(num_kv_heads, group_size):
    generator = torch.Generator().manual_seed(group_size)
    seq_lens = [1, 7, 16, 5]
    cu_seqlens = [0]
    for n in seq_lens:
        cu_seqlens.append(cu_seqlens[-1] + n)
    num_tokens, head_dim, scale = cu_seqlens[-1], 32, 32**-0.5
    q = torch.randn(num_tokens, num_kv_heads * group_size, head_dim, generator=generator)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)

    out = prefill_attention(q, k, v, cu_seqlens, scale)

    expected = _causal_attention_float64(q, k, v, cu_seqlens, scale)
    assert out.dtype == q.dtype
    assert ((out.double() - expected).abs().max() / expected.abs().max()).item() <= 1e-5


def test_prefill_keeps_bf16():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, 16, generator=generator).bfloat16()
    k = torch.randn(6, 2, 16, generator=generator).bfloat16()
    v = torch.randn(6, 2, 16, generator=generator).bfloat16()

    out = prefill_attention(q, k, v, [0, 2, 6], 0.25)

    expected = _causal_attention_float64(q, k, v, [0, 2, 6], 0.25)
    assert out.dtype == torch.bfloat16
    assert ((out.double() - expected).abs().max() / expected.abs().max()).item() <= 2e-2
