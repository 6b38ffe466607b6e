"""scripts/tune_moe.py's candidate tiles (the timing itself needs a GPU): every token count has some, each fits
in shared memory, scan tiles at decode sizes and sorted ones at prefill sizes, and each candidate gives the
experts' output (the interpreter, one small case per distinct tile)."""

import pytest
import torch

from qwen3_runtime.ops.fused_moe import fused_moe_reference, fused_moe_with
from scripts import tune_moe


@pytest.mark.parametrize("num_experts,hidden,inter,top_k", tune_moe.SHAPES)
def test_every_token_count_has_candidates_that_fit(num_experts, hidden, inter, top_k):
    for tokens in tune_moe.TOKENS:
        for n in (2 * inter, hidden):
            found = tune_moe.candidates(tokens, num_experts, top_k, n)
            assert found and len(set(found)) == len(found)
            assert all(
                tune_moe.SMEM_BYTES >= (c.num_stages - 1) * (c.block_m + c.block_n) * c.block_k * 2 for c in found
            )
            paths = {c.sorted for c in found}
            assert paths == ({False} if tokens < 32 else {True} if tokens > 128 else {False, True}), tokens


def test_each_distinct_candidate_tile_gives_the_experts_output():
    """A small case per distinct tile shape (pipeline depth means nothing to the interpreter)."""
    gen = torch.Generator().manual_seed(0)
    tokens, num_experts, top_k, hidden, inter = 5, 8, 2, 64, 32
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) * inter**-0.5
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, top_k, generator=gen)
    ref = fused_moe_reference(x, w13, w2, ids, weights)
    tiles = {c._replace(num_stages=1) for t in tune_moe.TOKENS for c in tune_moe.candidates(t, 128, 8, 1536)}
    for config in sorted(tiles):
        torch.testing.assert_close(fused_moe_with(x, w13, w2, ids, weights, config, config), ref, rtol=1e-5, atol=1e-5)
