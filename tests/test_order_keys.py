import pytest
import torch

from qwen3_runtime.order_keys import order_keys_reference, top_ids
from tests.conftest import edge_rows


def test_order_keys_order_as_the_stable_sort():
    values = torch.tensor([[1.5, -0.0, 0.0, float("-inf"), -2.5, 1.5, float("inf"), 3e38]])
    keys = order_keys_reference(values)
    assert keys.argsort(descending=True).tolist() == values.sort(descending=True, stable=True).indices.tolist()


@pytest.mark.parametrize("vocab", [1, 5, 127, 128, 129, 1000, 151_936])
def test_top_ids_are_the_stable_sorts_first_k(vocab):
    """Plain rows, ties everywhere, mostly -inf, zeros of both signs, huge values, a row sorted ascending (the top
    in the last, maybe partial block); k from 1 to past the number of blocks and to V."""
    gen = torch.Generator().manual_seed(vocab)
    rows = [
        *edge_rows(vocab, gen, ties=2, minus_inf_share=0.95),
        torch.arange(vocab, dtype=torch.float32) // 3,
    ]
    for k in sorted({1, 2, 20, vocab // 128 + 1, vocab} & set(range(1, vocab + 1))):
        for x in rows:
            expected = x.sort(descending=True, stable=True).indices[:k]
            assert torch.equal(top_ids(x, k), expected), k
