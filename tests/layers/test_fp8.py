"""FP8 projection weights: each method takes its FP8 kernel (ops/fp8_linear.py's names), fused parts load their rows
and their scales' block rows, a gate/up and a down_proj in different formats compose, and the blockwise reference
quantization the loader uses."""

import pytest
import torch
import torch.nn.functional as F

from qwen3_runtime.layers import fp8 as module
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.layers.fp8 import Fp8Weight
from qwen3_runtime.layers.linear import UnquantizedWeight
from qwen3_runtime.layers.loading import WeightError
from qwen3_runtime.ops.fp8_linear import dequantize_blocks, quantize_blocks
from qwen3_runtime.quantization import WeightFormat

STORED = LayerBuild(torch.float32, WeightFormat("fp8", from_checkpoint=True))  # an FP8 checkpoint's
QUANTIZED = LayerBuild(torch.float32, WeightFormat("fp8"))  # 16-bit tensors quantized as they load


@pytest.fixture
def calls(monkeypatch):
    """Each kernel entry point of layers/fp8.py replaced by a recorder of (name, args, kwargs)."""
    seen = []
    for name in ("fp8_linear", "fp8_gated_linear", "fp8_linear_partials", "fp8_mlp_partials", "fused_moe"):
        monkeypatch.setattr(module, name, lambda *a, _name=name, **kw: seen.append((_name, a, kw)) or _name)
    return seen


def test_parameters_are_the_checkpoints_weight_and_scale_inv():
    w = Fp8Weight(160, (256, 128, 128), STORED)
    assert [(name, tuple(p.shape), p.dtype) for name, p in w.named_parameters()] == [
        ("weight", (512, 160), torch.float8_e4m3fn),
        ("weight_scale_inv", (4, 2), torch.float32),
    ]
    assert w.suffixes == ("weight", "weight_scale_inv")
    assert Fp8Weight(160, (160,), QUANTIZED).suffixes == ("weight",)  # a 16-bit checkpoint has no scales


def test_each_method_takes_its_fp8_kernel(calls):
    w, down, x = Fp8Weight(8, (4, 4), STORED), Fp8Weight(4, (8,), STORED), torch.zeros(3, 8)
    assert w.matmul(x, dependents_early=True, invariant=True) == "fp8_linear"
    assert w.partials(x, invariant=True) == "fp8_linear_partials"
    assert not w.preloads(3)
    assert w.gated(x) == "fp8_gated_linear"
    assert w.gated_partials(down, x, invariant=True) == "fp8_mlp_partials"
    assert [(name, len(a), kw) for name, a, kw in calls] == [
        ("fp8_linear", 3, {"dependents_early": True, "invariant": True}),
        ("fp8_linear_partials", 3, {"invariant": True}),
        ("fp8_gated_linear", 3, {"invariant": False}),
        ("fp8_mlp_partials", 5, {"invariant": True}),
    ]
    assert calls[0][1][1:] == (w.weight, w.weight_scale_inv)
    assert calls[3][1][1:] == (w.weight, w.weight_scale_inv, down.weight, down.weight_scale_inv)


def test_experts_call_fused_moe_with_their_scales(calls):
    experts = module.Fp8Experts(4, 160, 128, STORED)
    x, ids, weights = torch.zeros(2, 160), torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, 2)
    assert experts.partials(x, ids, weights) == "fused_moe"
    ((name, args, kw),) = calls
    assert args == (x, experts.w13_weight, experts.w2_weight, ids, weights, False)
    assert kw == {"w13_scale": experts.w13_weight_scale_inv, "w2_scale": experts.w2_weight_scale_inv}
    assert experts.w13_weight_scale_inv.shape == (4, 2, 2) and experts.w2_weight_scale_inv.shape == (4, 2, 1)


def test_fused_parts_load_their_rows_and_their_scales_block_rows():
    w = Fp8Weight(160, (128, 256), STORED)
    gen = torch.Generator().manual_seed(0)
    parts = [quantize_blocks(torch.randn(rows, 160, generator=gen)) for rows in (128, 256)]
    for part, (weight, scale) in enumerate(parts):
        w.load_weight("weight", weight, part)
        w.load_weight("weight_scale_inv", scale.bfloat16(), part)  # a checkpoint's bf16 scales, kept in fp32
    assert torch.equal(w.weight.float(), torch.cat([p[0] for p in parts]).float())
    assert torch.equal(w.weight_scale_inv, torch.cat([p[1].bfloat16().float() for p in parts]))
    with pytest.raises(WeightError, match=r"has shape \(2, 2\), expected \(1, 2\)"):
        w.load_weight("weight_scale_inv", parts[1][1], 0)
    with pytest.raises(WeightError, match="is a part of 96 rows of a fused FP8 projection"):
        Fp8Weight(160, (96, 96), STORED).load_weight("weight", torch.zeros(96, 160, dtype=torch.float8_e4m3fn), 0)


def test_a_16_bit_tensor_is_quantized_as_it_loads():
    dense = torch.randn(160, 200, generator=torch.Generator().manual_seed(1)).bfloat16()
    w = Fp8Weight(200, (160,), QUANTIZED)
    w.load_weight("weight", dense)
    weight, scale = quantize_blocks(dense)
    assert torch.equal(w.weight.float(), weight.float()) and torch.equal(w.weight_scale_inv, scale)


@pytest.mark.parametrize("fp8_part", ["gate_up", "down"])
def test_gate_up_and_down_in_different_formats_compose(fp8_part):
    """modules_to_not_convert may keep one of them in 16 bits: the two products in turn, as the dense model's."""
    gen = torch.Generator().manual_seed(2)
    w13, w2 = torch.randn(256, 160, generator=gen) * 0.1, torch.randn(160, 128, generator=gen) * 0.1
    x = torch.randn(5, 160, generator=gen)
    weights = {}
    for name, dense, in_features, parts in (("gate_up", w13, 160, (128, 128)), ("down", w2, 128, (160,))):
        if name == fp8_part:
            weights[name] = Fp8Weight(in_features, parts, QUANTIZED)
            weights[name].load_weight("weight", dense)
            dense.copy_(dequantize_blocks(weights[name].weight, weights[name].weight_scale_inv))
        else:
            weights[name] = UnquantizedWeight(in_features, parts, LayerBuild(torch.float32))
            weights[name].weight.data.copy_(dense)
    out = weights["gate_up"].gated_partials(weights["down"], x).sum(0)
    gate, up = (x @ w13.t()).chunk(2, dim=-1)
    torch.testing.assert_close(out, (F.silu(gate) * up) @ w2.t(), rtol=1e-5, atol=1e-5)


def test_blockwise_quantization_of_partial_blocks():
    """Each 128 x 128 block (the last ones partial) scaled so its largest magnitude is e4m3's 448; e4m3's 3-bit
    mantissa bounds each value's error by 1/16 of its magnitude; a zero block stays zero."""
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.01, 10, 200)
    w[:128, :128] = 0
    weight, scale = quantize_blocks(w)
    assert weight.dtype == torch.float8_e4m3fn and weight.shape == (300, 200) and scale.shape == (3, 2)
    back = dequantize_blocks(weight, scale)
    assert back.dtype == torch.float32 and torch.equal(back[:128, :128], torch.zeros(128, 128))
    assert ((back - w).abs() <= w.abs() / 16 + scale.max() * 2**-9).all()
    assert weight[128:256, 128:].float().abs().max() == 448 and weight[256:, :128].float().abs().max() == 448
