"""Fused norm kernels against their references (Triton in the interpreter on the CPU)."""
import pytest
import torch

from qwen3_runtime.ops.norms import (add_rms_norm, add_rms_norm_reference, qk_norm_rope, qk_norm_rope_reference,
                                     silu_mul, silu_mul_reference)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [64, 100])
def test_add_rms_norm(dim):
    x, residual, weight = torch.randn(5, dim), torch.randn(5, dim) * 3, torch.randn(dim)
    _close(add_rms_norm(x, weight, 1e-6), add_rms_norm_reference(x, weight, 1e-6))
    res_a, res_b = residual.clone(), residual.clone()
    _close(add_rms_norm(x, weight, 1e-6, res_a), add_rms_norm_reference(x, weight, 1e-6, res_b))
    _close(res_a, residual + x)
    _close(res_b, residual + x)


@pytest.mark.parametrize("head_dim", [24, 32])
def test_qk_norm_rope(head_dim):
    heads, kv_heads, tokens = 4, 2, 6
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim)
    qw, kw = torch.randn(head_dim), torch.randn(head_dim)
    angles = torch.rand(50, head_dim // 2) * 6
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.tensor([0, 3, 49, 7, 7, 1])
    q, k = qk_norm_rope(qkv, heads, kv_heads, qw, kw, cos_sin, positions, 1e-6)
    q_ref, k_ref = qk_norm_rope_reference(qkv, heads, kv_heads, qw, kw, cos_sin, positions, 1e-6)
    assert q.shape == (tokens, heads, head_dim) and k.shape == (tokens, kv_heads, head_dim)
    _close(q, q_ref)
    _close(k, k_ref)


def test_silu_mul():
    gate_up = torch.randn(3, 2 * 1500) * 4
    _close(silu_mul(gate_up), silu_mul_reference(gate_up))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_kernels_match_their_references_on_the_gpu():
    dev, bf16 = "cuda", torch.bfloat16
    x, res = (torch.randn(33, 2560, device=dev, dtype=bf16) for _ in range(2))
    w = torch.randn(2560, device=dev, dtype=bf16)
    res_ref = res.clone()
    out = add_rms_norm(x, w, 1e-6, res)
    ref = add_rms_norm_reference(x, w, 1e-6, res_ref)
    assert torch.equal(res, res_ref)
    assert (out.float() - ref.float()).abs().max() <= 0.02 * ref.float().abs().max()
    qkv = torch.randn(9, 48 * 128, device=dev, dtype=bf16)
    qw, kw = torch.randn(128, device=dev, dtype=bf16), torch.randn(128, device=dev, dtype=bf16)
    angles = torch.rand(4096, 64, device=dev) * 6
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    pos = torch.randint(0, 4096, (9,), device=dev)
    for a, b in zip(qk_norm_rope(qkv, 32, 8, qw, kw, cos_sin, pos, 1e-6),
                    qk_norm_rope_reference(qkv, 32, 8, qw, kw, cos_sin, pos, 1e-6)):
        assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()
    gate_up = torch.randn(17, 2 * 9728, device=dev, dtype=bf16)
    a, b = silu_mul(gate_up), silu_mul_reference(gate_up)
    assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()
