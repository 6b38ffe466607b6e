import pytest
import torch

from qwen3_runtime.ops import invariant_linear as invariant_module
from qwen3_runtime.ops.invariant_linear import BLOCK_M, BLOCK_N, invariant_linear, invariant_linear_reference


@pytest.mark.parametrize("rows", [1, 5, BLOCK_M + 3])
@pytest.mark.parametrize("n,k", [(128, 64), (150, 100)])  # whole tiles / ragged N and K
def test_invariant_linear_matches_the_product(rows, n, k):
    gen = torch.Generator().manual_seed(rows * n + k)
    x, weight = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    x[0, 0] = 1e30  # a huge value stays in its row
    out = invariant_linear(x, weight)
    ref = invariant_linear_reference(x, weight)
    assert out.shape == (rows, n) and out.dtype == x.dtype
    torch.testing.assert_close(out[1:], ref[1:], rtol=1e-5, atol=1e-5 * k)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-5 * k * 1e30)


# Ragged, and whole tiles over several column tiles, as the lm_head's (Qwen3's vocabulary is 1187 of them): the
# kernel takes every N alike, so more tiles would only add programs, each slow in the interpreter.
@pytest.mark.parametrize("n", [130, 8 * BLOCK_N])
def test_invariant_linear_writes_fp32_from_bf16_operands(n):
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(3, 64, generator=gen).bfloat16(), torch.randn(n, 64, generator=gen).bfloat16()
    out = invariant_linear(x, weight, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and out.isfinite().all()
    torch.testing.assert_close(out, invariant_linear_reference(x, weight, torch.float32), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the interpreter's dot is numpy's)")
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_a_rows_result_is_the_same_bits_in_every_batch(out_dtype):
    """Row r alone, among other rows, at another place in a tile, in batches over several tiles (bf16, as served)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    weight = torch.randn(2560, 1000, generator=gen, device="cuda").bfloat16()
    rows = torch.randn(3 * BLOCK_M + 9, 1000, generator=gen, device="cuda").bfloat16()
    whole = invariant_linear(rows, weight, out_dtype)
    for r in (0, 7, BLOCK_M + 8, 3 * BLOCK_M + 8):
        assert torch.equal(invariant_linear(rows[r : r + 1].clone(), weight, out_dtype)[0], whole[r])
        others = torch.cat([torch.randn(3, 1000, generator=gen, device="cuda").bfloat16(), rows[r : r + 1]])
        assert torch.equal(invariant_linear(others, weight, out_dtype)[3], whole[r])


@pytest.mark.parametrize("rows, n, k", [(1, 1, 1), (BLOCK_M, BLOCK_N + 1, 65)])  # a single element; tile edges
def test_every_output_is_written(monkeypatch, rows, n, k):
    """The output starts as NaN: a 1x1 product of one term, and a full row tile beside a column tile of one."""
    empty = torch.empty
    monkeypatch.setattr(invariant_module.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    gen = torch.Generator().manual_seed(rows + n + k)
    x, weight = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    out = invariant_linear(x, weight)
    torch.testing.assert_close(out, invariant_linear_reference(x, weight), rtol=1e-5, atol=1e-5 * k)
