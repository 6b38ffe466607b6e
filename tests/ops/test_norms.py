"""Fused norm kernels against their references (Triton in the interpreter on the CPU)."""

import pytest
import torch

from qwen3_runtime.ops import norms
from qwen3_runtime.ops.norms import add_rms_norm, add_rms_norm_reference, silu_mul, silu_mul_reference


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


def test_add_rms_norm_adds_split_partials_first():
    parts, residual, weight = torch.randn(3, 5, 100), torch.randn(5, 100) * 3, torch.randn(100)
    res_a, res_b = residual.clone(), residual.clone()
    _close(add_rms_norm(parts, weight, 1e-6, res_a), add_rms_norm_reference(parts, weight, 1e-6, res_b))
    _close(res_a, residual + parts.sum(0))
    _close(res_b, residual + parts.sum(0))


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
    gate_up = torch.randn(17, 2 * 9728, device=dev, dtype=bf16)
    a, b = silu_mul(gate_up), silu_mul_reference(gate_up)
    assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()


def _poison_empty(monkeypatch):
    empty = torch.empty
    monkeypatch.setattr(norms.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))


@pytest.mark.parametrize("rows, dim", [(1, 1), (1, 7), (3, 128), (2, 129)])
def test_add_rms_norm_writes_every_element(monkeypatch, rows, dim):
    """Outputs start as NaN: one row, one column, a power of two and one past it."""
    _poison_empty(monkeypatch)
    gen = torch.Generator().manual_seed(dim)
    x, residual, weight = (torch.randn(shape, generator=gen) for shape in ((rows, dim), (rows, dim), (dim,)))
    _close(add_rms_norm(x, weight, 1e-6), add_rms_norm_reference(x, weight, 1e-6))
    res_a, res_b = residual.clone(), residual.clone()
    _close(add_rms_norm(x, weight, 1e-6, res_a), add_rms_norm_reference(x, weight, 1e-6, res_b))
    _close(res_a, res_b)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy: exp(1e4) overflows, as meant
@pytest.mark.parametrize("n_cols", [1, 1024, 1025])  # one column; the block exactly; one past it
def test_silu_mul_writes_every_element(monkeypatch, n_cols):
    _poison_empty(monkeypatch)
    gate_up = torch.randn(2, 2 * n_cols, generator=torch.Generator().manual_seed(n_cols)) * 4
    gate_up[0, 0] = -1e4  # exp(-gate) overflows: silu is -0.0
    _close(silu_mul(gate_up), silu_mul_reference(gate_up))
