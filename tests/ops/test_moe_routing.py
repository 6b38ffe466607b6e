"""Routing (Triton in the interpreter on the CPU) against its reference: softmax, top-k with ties to the lower id,
renormalisation, padded rows."""

import pytest
import torch

from qwen3_runtime.ops.moe_routing import route, route_reference
from tests.conftest import edge_rows

# The interpreter's numpy warns where the GPU is silent: the huge row's maximum subtracted, NaN rows.
pytestmark = pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")


def _logits(num_experts: int, gen: torch.Generator) -> torch.Tensor:
    """The edge rows (plain, ties everywhere, a share of -inf, zeros, huge), then two plain rows."""
    return torch.stack(edge_rows(num_experts, gen) + [torch.randn(num_experts, generator=gen) * 2 for _ in range(2)])


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize(
    "num_experts,top_k",
    [(1, 1), (4, 2), (8, 8), (60, 1), (60, 60), (128, 8), (300, 7)],  # k = E; E not a power of two; E = 128, k = 8
)
def test_route_matches_the_reference(num_experts, top_k, renormalize):
    gen = torch.Generator().manual_seed(num_experts * 31 + top_k)
    logits = _logits(num_experts, gen)
    valid = torch.ones(len(logits), dtype=torch.bool)
    ids, weights = route(logits, valid, top_k, renormalize)
    ref_ids, ref_weights = route_reference(logits, valid, top_k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == (len(logits), top_k)
    assert torch.equal(ids, ref_ids)  # ties (the integer and zero rows, the -inf share) to the lower id
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)


def test_bf16_logits_are_taken_in_fp32():
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    valid = torch.ones(5, dtype=torch.bool)
    ids, weights = route(logits, valid, 8, True)
    ref_ids, ref_weights = route_reference(logits, valid, 8, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)


def test_equal_logits_route_to_the_lowest_ids():
    ids, weights = route(torch.zeros(2, 16), torch.ones(2, dtype=torch.bool), 4, False)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2
    torch.testing.assert_close(weights, torch.full((2, 4), 1 / 16))


def test_padded_rows_route_to_expert_e_with_weight_0():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 12, generator=gen)
    logits[1] = float("nan")  # a padded row's garbage logits
    valid = torch.tensor([True, False, True, False, False, True])
    for renormalize in (False, True):
        ids, weights = route(logits, valid, 3, renormalize)
        ref_ids, ref_weights = route_reference(logits, valid, 3, renormalize)
        assert (ids[~valid] == 12).all() and (weights[~valid] == 0).all()
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)


def test_non_finite_logits_still_route_to_distinct_experts():
    """A valid row whose logits are NaN (all or some) still names k distinct experts below E, so the expert kernels
    read only real weights."""
    logits = torch.randn(3, 20)
    logits[0] = float("nan")
    logits[1, ::2] = float("nan")
    logits[2] = float("-inf")
    ids, _ = route(logits, torch.ones(3, dtype=torch.bool), 6, True)
    assert ((ids >= 0) & (ids < 20)).all()
    assert all(len(set(row)) == 6 for row in ids.tolist())


def test_no_rows():
    ids, weights = route(torch.randn(0, 8), torch.ones(0, dtype=torch.bool), 2, True)
    assert ids.shape == weights.shape == (0, 2)


def test_partial_sums_of_the_logits_are_added_before_the_softmax():
    """The router's logits as the skinny kernel's [S, T, E] slices of the hidden size: routed as their sum."""
    gen = torch.Generator().manual_seed(5)
    parts = torch.randn(3, 6, 128, generator=gen)
    valid = torch.tensor([True, True, False, True, True, True])
    ids, weights = route(parts, valid, 8, True)
    ref_ids, ref_weights = route_reference(parts.sum(0), valid, 8, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)
