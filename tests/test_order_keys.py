import torch

from qwen3_runtime.order_keys import order_keys_reference


def test_order_keys_order_as_the_stable_sort():
    values = torch.tensor([[1.5, -0.0, 0.0, float("-inf"), -2.5, 1.5, float("inf"), 3e38]])
    keys = order_keys_reference(values)
    assert keys.argsort(descending=True).tolist() == values.sort(descending=True, stable=True).indices.tolist()
