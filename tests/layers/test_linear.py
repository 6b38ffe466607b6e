"""The projection weight calls the same kernels, with the same arguments, that the layers called on a tensor."""

import pytest
import torch

from qwen3_runtime.layers import linear as module
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.linear import UnquantizedWeight


@pytest.fixture
def calls(monkeypatch):
    """Each kernel entry point of layers/linear.py replaced by a recorder of (name, args, kwargs)."""
    seen = []
    for name in ("linear", "linear_partials", "mlp_partials", "preload_applies", "preloaded_partials"):
        monkeypatch.setattr(module, name, lambda *a, _name=name, **kw: seen.append((_name, a, kw)) or _name)
    return seen


def _weight(in_features=8, out_parts=(4, 2, 2), dtype=torch.bfloat16):
    return UnquantizedWeight(in_features, out_parts, LayerBuild(dtype))


def test_the_fused_weight_is_one_parameter_with_rows_per_part():
    w = _weight()
    assert [(name, tuple(p.shape), p.dtype) for name, p in w.named_parameters()] == [("weight", (8, 8), torch.bfloat16)]
    assert [w.part_rows(i) for i in range(3)] == [slice(0, 4), slice(4, 6), slice(6, 8)]


def test_each_method_takes_its_kernel(calls):
    w, down, x = _weight(), _weight(4, (8,)), torch.zeros(3, 8)
    assert w.matmul(x, dependents_early=True, invariant=True) == "linear"
    assert w.partials(x, invariant=True) == "linear_partials"
    assert w.partials(x, preloaded=True) == "preloaded_partials"
    assert w.preloads(3) == "preload_applies"
    assert w.gated_partials(down, x, invariant=True) == "mlp_partials"  # one call: down_proj launches early
    assert [(name, len(a), kw) for name, a, kw in calls] == [
        ("linear", 2, {"dependents_early": True, "invariant": True}),
        ("linear_partials", 2, {"invariant": True}),
        ("preloaded_partials", 2, {}),
        ("preload_applies", 2, {}),
        ("mlp_partials", 4, {}),
    ]
    assert calls[0][1][1] is w.weight and calls[3][1] == (3, w.weight)
    assert calls[4][1][1:] == (w.weight, down.weight, True)
