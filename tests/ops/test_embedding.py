"""The decode step's input-token selection and embedding against its PyTorch reference."""

import pytest
import torch

from qwen3_runtime.ops import embedding
from qwen3_runtime.ops.embedding import BLOCK, embed, embed_reference


@pytest.mark.parametrize("hidden", [64, 1100])
def test_embed_matches_reference(hidden):
    weight = torch.randn(50, hidden)
    input_ids = torch.tensor([3, 0, 49, 7, 12])
    assert torch.equal(embed(weight, input_ids), embed_reference(weight, input_ids))
    # Rows 1 and 3 take the token the step in flight sampled in its rows 2 and 0 (a strided column).
    prev_row = torch.tensor([-1, 2, -1, 0, -1])
    sampled = torch.tensor([[40, 1, 1], [9, 1, 1], [21, 1, 1]], dtype=torch.int32)[:, 0]
    out = embed(weight, input_ids, prev_row, sampled)
    assert torch.equal(out, embed_reference(weight, input_ids, prev_row, sampled))
    assert torch.equal(out, weight[[3, 21, 49, 40, 12]])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_embed_matches_reference_on_the_gpu():
    weight = torch.randn(151936, 2560, device="cuda", dtype=torch.bfloat16)
    input_ids = torch.randint(0, 151936, (8,), device="cuda")
    prev_row = torch.tensor([-1, 3, 0, -1, 7, 2, -1, 1], device="cuda")
    sampled = torch.randint(0, 151936, (8, 45), device="cuda", dtype=torch.int32)[:, 0]
    assert torch.equal(
        embed(weight, input_ids, prev_row, sampled), embed_reference(weight, input_ids, prev_row, sampled)
    )


@pytest.mark.parametrize("hidden", [1, BLOCK, BLOCK + 1])  # one column; a block exactly; one past it
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_element_is_written(monkeypatch, hidden, dtype):
    """The output starts as NaN: one row, the first and last token ids, columns at and past a block edge."""
    empty = torch.empty
    monkeypatch.setattr(embedding.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    gen = torch.Generator().manual_seed(hidden)
    weight = torch.randn(30, hidden, generator=gen).to(dtype)
    for input_ids in (torch.tensor([29]), torch.tensor([0, 29, 0])):
        assert torch.equal(embed(weight, input_ids), weight[input_ids])
    prev_row, sampled = torch.tensor([-1, 0]), torch.tensor([29], dtype=torch.int32)
    assert torch.equal(embed(weight, torch.tensor([5, 3]), prev_row, sampled), weight[[5, 29]])
