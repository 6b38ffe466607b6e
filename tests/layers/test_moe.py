"""The sparse MoE block: its routes to the stacked experts, and its output against a per-token loop over the experts
(transformers' computation); padded rows route to no expert and add nothing."""

import pytest
import torch
import torch.nn.functional as F

from qwen3_runtime.layers.attention import AttentionMetadata
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.loading import routes
from qwen3_runtime.layers.moe import SparseMoeBlock

HIDDEN, INTER, EXPERTS = 16, 8, 6


def _block(top_k: int, renormalize: bool) -> SparseMoeBlock:
    block = SparseMoeBlock(HIDDEN, INTER, EXPERTS, top_k, renormalize, LayerBuild(torch.float32))
    gen = torch.Generator().manual_seed(0)
    for p in block.parameters():
        p.data.normal_(0, 0.5, generator=gen)
    return block


def test_routes_stack_each_experts_projections():
    block = _block(2, True)
    table = dict(routes(block, "mlp."))
    per_expert = ("gate_proj", "up_proj", "down_proj")
    assert set(table) == {"mlp.gate.weight"} | {
        f"mlp.experts.{e}.{name}.weight" for e in range(EXPERTS) for name in per_expert
    }
    gate, up, down = (table[f"mlp.experts.4.{name}.weight"] for name in per_expert)
    assert [(r.suffix, r.part, r.expert) for r in (gate, up, down)] == [
        ("w13_weight", 0, 4),
        ("w13_weight", 1, 4),
        ("w2_weight", None, 4),
    ]
    tensors = [torch.randn(INTER, HIDDEN), torch.randn(INTER, HIDDEN), torch.randn(HIDDEN, INTER)]
    for route, tensor in zip((gate, up, down), tensors):
        route.load(tensor)
    experts = block.experts
    assert torch.equal(experts.w13_weight[4], torch.cat(tensors[:2])) and torch.equal(experts.w2_weight[4], tensors[2])
    assert table["mlp.gate.weight"].target is block.gate


def _reference(block: SparseMoeBlock, x: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
    """transformers' Qwen3MoeSparseMoeBlock, token by token."""
    probs = F.softmax(x @ block.gate.weight.t(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    w13, w2 = block.experts.w13_weight, block.experts.w2_weight
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, e in zip(weights[t], ids[t].tolist()):
            gate, up = (w13[e] @ x[t]).chunk(2)
            out[t] += weight * (w2[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("top_k, renormalize", [(1, False), (2, True), (3, False), (EXPERTS, True)])
def test_output_is_the_weighted_experts_and_padded_rows_route_nowhere(top_k, renormalize, monkeypatch):
    block = _block(top_k, renormalize)
    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(1))
    slots = torch.tensor([4, -1, 9, 0, -1, 2, 3])
    routed = []
    partials = block.experts.partials
    monkeypatch.setattr(
        block.experts, "partials", lambda x, ids, w, inv: routed.append((ids, w)) or partials(x, ids, w)
    )
    with torch.no_grad():
        out = block(x, AttentionMetadata(slot_mapping=slots))
    assert out.shape == (top_k, 7, HIDDEN) and out.dtype == torch.float32
    real = slots >= 0
    torch.testing.assert_close(out.sum(0)[real], _reference(block, x, top_k, renormalize)[real])
    ids, weights = routed[0]
    assert ids.dtype == torch.int32 and (ids[~real] == EXPERTS).all() and (ids[real] < EXPERTS).all()
    assert (weights[~real] == 0).all() and (out[:, ~real] == 0).all()


def test_a_checkpoints_experts_land_in_their_stacks(tiny_moe_checkpoint):
    """Every tensor transformers writes has a route, and each expert's projections are its rows of w13 and w2."""
    from safetensors.torch import load_file

    from qwen3_runtime.config import ModelConfig
    from qwen3_runtime.loader import load_model

    model = load_model(ModelConfig(path=str(tiny_moe_checkpoint)), torch.device("cpu"), torch.float32)
    tensors = load_file(tiny_moe_checkpoint / "model.safetensors")
    assert set(dict(routes(model))) == set(tensors)
    block = model.model.layers[2].mlp
    name = "model.layers.2.mlp.{}.weight".format
    assert torch.equal(block.gate.weight, tensors[name("gate")])
    for e in range(block.experts.num_experts):
        gate, up = block.experts.w13_weight[e].chunk(2)
        assert torch.equal(gate, tensors[name(f"experts.{e}.gate_proj")])
        assert torch.equal(up, tensors[name(f"experts.{e}.up_proj")])
        assert torch.equal(block.experts.w2_weight[e], tensors[name(f"experts.{e}.down_proj")])


def test_the_router_gives_skinny_partials_at_decode_sizes_and_fp32_logits_above(monkeypatch):
    """Under the interpreter (as on the GPU) up to FUSED_MAX_ROWS rows the router's logits come as the skinny
    kernel's fp32 partial sums; their sum, and the full product above, are x @ weight^T."""
    from qwen3_runtime.layers.build import LayerBuild
    from qwen3_runtime.layers.moe import Router
    from qwen3_runtime.ops.linear import FUSED_MAX_ROWS

    router = Router(256, 8, LayerBuild(torch.float32))
    router.weight.data.normal_(generator=torch.Generator().manual_seed(0))
    for rows in (3, FUSED_MAX_ROWS + 1):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
        logits = router(x)
        assert logits.dtype == torch.float32 and logits.dim() == (3 if rows <= FUSED_MAX_ROWS else 2)
        summed = logits.sum(0) if logits.dim() == 3 else logits
        torch.testing.assert_close(summed, x @ router.weight.t(), rtol=1e-5, atol=1e-5)
