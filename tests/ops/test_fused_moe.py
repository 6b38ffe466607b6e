"""The expert kernels (Triton in the interpreter on the CPU) against their reference, on both ways of finding an
expert's rows, with every output poisoned until written and every unrouted expert's weights NaN."""

import json

import pytest
import torch

from qwen3_runtime.ops import fused_moe as fused_moe_module
from qwen3_runtime.ops import moe_config
from qwen3_runtime.ops.fp8_linear import dequantize_blocks, quantize_blocks
from qwen3_runtime.ops.fused_moe import fused_moe, fused_moe_reference, fused_moe_with, group_by_expert
from qwen3_runtime.ops.moe_config import INVARIANT_CONFIG, MoeConfig, default_config, lookup, tuned_config

# Small tiles, so the interpreter's cases span several row blocks, column tiles and K-tiles (ragged ones too).
SCAN = MoeConfig(sorted=False, block_m=16, block_n=32, block_k=32)
SORTED = MoeConfig(sorted=True, block_m=16, block_n=32, block_k=32, group_m=2)


def _case(tokens, num_experts, top_k, hidden, inter, dtype, padded=(), seed=0):
    """Random x and weights, each token routed to k distinct random experts (rows in `padded` to expert E, their x
    NaN); every expert no pair reaches has NaN weights, which must never reach the output."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) * hidden**-0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, generator=gen) * inter**-0.5).to(dtype)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, top_k, generator=gen)
    padded = list(padded)
    ids[padded], weights[padded], x[padded] = num_experts, 0.0, float("nan")
    unrouted = torch.ones(num_experts, dtype=torch.bool)
    unrouted[ids[ids < num_experts].long()] = False
    w13[unrouted], w2[unrouted] = float("nan"), float("nan")
    return x, w13, w2, ids, weights


@pytest.fixture
def poisoned(monkeypatch):
    """The kernels' outputs and intermediates start as NaN, so an element left unwritten shows."""
    empty = torch.empty
    monkeypatch.setattr(fused_moe_module.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))


def _check(out, x, w13, w2, ids, weights, dtype):
    ref = fused_moe_reference(x, w13, w2, ids, weights)
    assert out.shape == (ids.shape[1], x.shape[0], x.shape[1]) and out.dtype == torch.float32
    assert not out.isnan().any()
    padded = ids == w13.shape[0]
    assert (out.transpose(0, 1)[padded] == 0).all()
    # bf16: gate, up and act are rounded to bf16, and a different fp32 sum can round the other way.
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.05)
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("config", [SCAN, SORTED], ids=["scan", "sorted"])
@pytest.mark.parametrize(
    "tokens,num_experts,top_k,hidden,inter,padded",
    [
        (3, 8, 2, 64, 32, (0,)),  # fewer pairs than experts: scan programs take the experts present
        (20, 4, 4, 48, 40, (5, 19)),  # k = E; more rows per expert than a tile (18 > 16); ragged K and N
        (5, 1, 1, 32, 32, ()),  # one expert
        (40, 8, 2, 64, 48, (1,)),  # more pairs than experts: a scan program per expert
        (4, 60, 8, 32, 32, (2,)),  # E not a power of two, most experts without a token
        (3, 128, 8, 32, 16, (1,)),  # Qwen3-30B-A3B's routing at a few tokens
    ],
)
def test_kernels_match_the_reference(poisoned, config, tokens, num_experts, top_k, hidden, inter, padded):
    case = _case(tokens, num_experts, top_k, hidden, inter, torch.float32, padded, seed=tokens * num_experts)
    _check(fused_moe_with(*case, config, config), *case, torch.float32)


@pytest.mark.parametrize("gate_up,down", [(SCAN, SORTED), (SORTED, SCAN)], ids=["scan-sorted", "sorted-scan"])
def test_bf16_and_each_kernel_its_own_path(poisoned, gate_up, down):
    case = _case(9, 16, 4, 64, 48, torch.bfloat16, padded=(3,))
    _check(fused_moe_with(*case, gate_up, down), *case, torch.bfloat16)


def test_every_pair_padded(poisoned):
    case = _case(4, 8, 2, 32, 32, torch.float32, padded=range(4))
    for config in (SCAN, SORTED):
        assert torch.equal(fused_moe_with(*case, config, config), torch.zeros(2, 4, 32))


def test_fused_moe_takes_the_default_configuration_and_the_reference_without_triton(monkeypatch):
    case = _case(6, 8, 2, 64, 32, torch.float32, padded=(2,))
    _check(fused_moe(*case), *case, torch.float32)
    _check(fused_moe(*case, invariant=True), *case, torch.float32)
    monkeypatch.setattr(fused_moe_module, "use_triton", lambda t: False)
    _check(fused_moe(*case), *case, torch.float32)


def test_invariant_mode_takes_one_configuration_at_every_token_count(monkeypatch):
    seen = []
    monkeypatch.setattr(fused_moe_module, "fused_moe_with", lambda *args, **scales: seen.append(args[-2:]))
    for tokens in (1, 8, 300, 5000):
        case = _case(tokens, 4, 2, 16, 16, torch.float32)
        fused_moe(*case, invariant=True)
    assert seen == [(INVARIANT_CONFIG, INVARIANT_CONFIG)] * 4


def test_grouping_by_expert_covers_every_pair_once():
    gen = torch.Generator().manual_seed(5)
    num_experts, block_m = 10, 4
    ids = torch.randint(0, num_experts + 1, (37,), generator=gen, dtype=torch.int32)  # E: padded rows' pairs
    ids[:9] = 3  # an expert over several blocks
    order, table = group_by_expert(ids, num_experts, block_m)
    expert, first, end = table.long()
    used = expert <= num_experts
    assert (expert[~used] == num_experts + 1).all() and used.sum() == sum(
        -(-int((ids == e).sum()) // block_m) for e in range(num_experts + 1)
    )
    covered = []
    for e, a, b in zip(expert[used].tolist(), first[used].tolist(), end[used].tolist()):
        rows = order[a : min(b, a + block_m)].long()
        assert len(rows) > 0 and (ids[rows] == e).all()
        covered += rows.tolist()
    assert sorted(covered) == list(range(len(ids)))


def test_tuned_configurations_come_from_the_file_by_token_count(tmp_path):
    path = tmp_path / moe_config.config_file_name(128, 1536, 2048, 8, torch.bfloat16, "NVIDIA_H100_80GB_HBM3")
    assert path.name == "E=128,N=1536,K=2048,top_k=8,dtype=bfloat16,device=NVIDIA_H100_80GB_HBM3.json"
    assert tuned_config(path, 4) is None  # no file
    small, large = SCAN._replace(block_n=64), SORTED._replace(block_m=128)
    path.write_text(json.dumps({"1": SCAN._asdict(), "8": small._asdict(), "4096": large._asdict()}))
    picks = [tuned_config(path, tokens) for tokens in (1, 2, 8, 9, 4096, 10000)]
    assert picks == [SCAN, small, small, large, large, None]  # the smallest count at least T; past them, none


def test_lookup_defaults_without_a_file():
    weight = torch.empty(8, 64, 32)
    assert lookup(weight, 3, 2) == default_config(3, 2) and not default_config(3, 2).sorted
    assert default_config(4096, 8).sorted
    assert lookup(weight, 3, 2, invariant=True) == INVARIANT_CONFIG


def test_shipped_configuration_files_parse():
    for path in moe_config.CONFIG_DIR.glob("*.json"):
        assert tuned_config(path, 1) is not None, path


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the interpreter's dot is numpy's)")
def test_on_the_gpu_bf16_paths_agree_and_invariant_bits_do_not_depend_on_the_batch():
    dev = "cuda"
    x, w13, w2, ids, weights = (t.to(dev) for t in _case(300, 128, 8, 256, 128, torch.bfloat16, padded=(7,)))
    ref = fused_moe_reference(x, w13, w2, ids, weights)
    for config in (default_config(4, 8), default_config(4096, 8), INVARIANT_CONFIG):
        out = fused_moe_with(x, w13, w2, ids, weights, config, config)
        assert not out.isnan().any() and (out - ref).abs().max() <= 0.05 * ref.abs().max()
    whole = fused_moe(x, w13, w2, ids, weights, invariant=True)
    for t in (0, 7, 150, 299):
        alone = fused_moe(x[t : t + 1], w13, w2, ids[t : t + 1], weights[t : t + 1], invariant=True)
        assert torch.equal(alone[:, 0], whole[:, t])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_a_captured_layer_routes_padded_rows_nowhere():
    """Routing and both expert kernels captured in a CUDA graph at 8 rows, 5 of them padding (their x NaN), every
    expert no real row reaches NaN: replayed on new inputs, the padded rows' outputs are exactly 0 and the real rows'
    are the reference's."""
    from qwen3_runtime.ops.moe_routing import route

    dev, num_experts, top_k, hidden, inter = "cuda", 128, 8, 2048, 768
    gen = torch.Generator().manual_seed(0)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) * hidden**-0.5).to(dev, torch.bfloat16)
    w2 = (torch.randn(num_experts, hidden, inter, generator=gen) * inter**-0.5).to(dev, torch.bfloat16)
    x = torch.zeros(8, hidden, dtype=torch.bfloat16, device=dev)
    logits = torch.zeros(8, num_experts, device=dev)
    valid = torch.zeros(8, dtype=torch.bool, device=dev)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compilation) off the capture
        fused_moe(x, w13, w2, *route(logits, valid, top_k, True))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, weights = route(logits, valid, top_k, True)
        out = fused_moe(x, w13, w2, ids, weights)
    real = torch.tensor([1, 4, 6])
    x.copy_(torch.randn(8, hidden, generator=gen).to(torch.bfloat16))
    x[~torch.isin(torch.arange(8), real)] = float("nan")
    logits.copy_(torch.randn(8, num_experts, generator=gen))
    valid.copy_(torch.isin(torch.arange(8), real))
    want_ids, want_weights = route(logits, valid, top_k, True)
    routed = torch.zeros(num_experts + 1, dtype=torch.bool, device=dev)
    routed[want_ids.flatten().long()] = True
    w13[~routed[:num_experts]], w2[~routed[:num_experts]] = float("nan"), float("nan")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(ids, want_ids) and not out.isnan().any()
    assert (out[:, ~valid] == 0).all()
    ref = fused_moe_reference(x[valid], w13, w2, want_ids[valid], want_weights[valid])
    assert (out[:, valid] - ref).abs().max() <= 0.05 * ref.abs().max()


# Block-FP8 experts (weight-only): the kernels against the reference on the dequantized weights.


def _fp8_case(tokens, num_experts, top_k, hidden, inter, dtype=torch.float32, padded=(), seed=0, tied=False):
    """_case's routing and inputs, the experts quantized blockwise (unrouted experts: NaN weights and scales). tied:
    every token routed to the same experts in the same slots with equal weights, so one expert's rows span blocks."""
    x, w13, w2, ids, weights = _case(tokens, num_experts, top_k, hidden, inter, torch.float32, padded, seed)
    if tied:
        real = ids[:, 0] < num_experts
        ids[real] = ids[real][:1].expand(int(real.sum()), top_k)
        weights[real] = 1.0 / top_k
        routed = torch.zeros(num_experts, dtype=torch.bool)
        routed[ids[ids < num_experts].long()] = True
        gen = torch.Generator().manual_seed(seed)
        w13[routed] = torch.randn(int(routed.sum()), 2 * inter, hidden, generator=gen) * hidden**-0.5
        w2[routed] = torch.randn(int(routed.sum()), hidden, inter, generator=gen) * inter**-0.5
    (q13, s13), (q2, s2) = quantize_blocks(w13), quantize_blocks(w2)
    unrouted = w13.flatten(1).isnan().any(1)
    s13[unrouted], s2[unrouted] = float("nan"), float("nan")
    return (x.to(dtype), q13, q2, ids, weights), dict(w13_scale=s13, w2_scale=s2)


def _check_fp8(out, case, scales, dtype=torch.float32):
    x, w13, w2, ids, weights = case
    ref = fused_moe_reference(*case, **scales)
    unquantized = fused_moe_reference(
        x, dequantize_blocks(w13, scales["w13_scale"]), dequantize_blocks(w2, scales["w2_scale"]), ids, weights
    )
    torch.testing.assert_close(ref, unquantized, rtol=0, atol=0, equal_nan=True)
    assert out.shape == (ids.shape[1], x.shape[0], x.shape[1]) and out.dtype == torch.float32
    assert not out.isnan().any() and (out.transpose(0, 1)[ids == w13.shape[0]] == 0).all()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.05)
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("config", [SCAN, SORTED], ids=["scan", "sorted"])
@pytest.mark.parametrize(
    "tokens,num_experts,top_k,hidden,inter,padded,tied",
    [
        (3, 8, 2, 64, 128, (0,), False),  # fewer pairs than experts
        (20, 4, 4, 200, 128, (5, 19), False),  # k = E; ragged hidden: partial scale blocks in both kernels
        (5, 1, 1, 130, 256, (), False),  # one expert, two blocks of I, hidden one past a block
        (18, 8, 2, 64, 128, (3,), True),  # ties: one expert's 17 rows over two 16-row blocks, equal weights
        (3, 128, 8, 32, 128, (1,), False),  # Qwen3-30B-A3B's routing at a few tokens
    ],
)
def test_fp8_experts_match_the_reference(poisoned, config, tokens, num_experts, top_k, hidden, inter, padded, tied):
    case, scales = _fp8_case(tokens, num_experts, top_k, hidden, inter, padded=padded, seed=tokens, tied=tied)
    _check_fp8(fused_moe_with(*case, config, config, **scales), case, scales)


def test_fp8_experts_with_bf16_activations_and_the_default_configurations(poisoned):
    case, scales = _fp8_case(9, 16, 4, 64, 128, torch.bfloat16, padded=(3,))
    _check_fp8(fused_moe_with(*case, SCAN, SORTED, **scales), case, scales, torch.bfloat16)
    case, scales = _fp8_case(6, 8, 2, 160, 128, padded=(2,))
    _check_fp8(fused_moe(*case, **scales), case, scales)  # default: scan, 128-wide K-tiles
    _check_fp8(fused_moe(*case, invariant=True, **scales), case, scales)  # sorted, 64-wide K-tiles


def test_fp8_every_pair_padded_and_the_reference_without_triton(poisoned, monkeypatch):
    case, scales = _fp8_case(4, 8, 2, 32, 128, padded=range(4))
    for config in (SCAN, SORTED):
        assert torch.equal(fused_moe_with(*case, config, config, **scales), torch.zeros(2, 4, 32))
    case, scales = _fp8_case(6, 8, 2, 64, 128, padded=(1,))
    monkeypatch.setattr(fused_moe_module, "use_triton", lambda t: False)
    _check_fp8(fused_moe(*case, **scales), case, scales)


def test_fp8_experts_need_whole_scale_blocks_of_the_intermediate_size_and_k_tiles_inside_a_block():
    case, scales = _fp8_case(2, 4, 2, 64, 128)
    with pytest.raises(AssertionError):
        fused_moe_with(*case, SCAN, SCAN._replace(block_k=256), **scales)
    w13, w2 = quantize_blocks(torch.randn(4, 192, 64)), quantize_blocks(torch.randn(4, 64, 96))
    x, _, _, ids, weights = case
    with pytest.raises(AssertionError):
        fused_moe_with(x, w13[0], w2[0], ids, weights, SCAN, SCAN, w13_scale=w13[1], w2_scale=w2[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 8, 64, 1024])
def test_fp8_experts_of_qwen3_30b_a3b_on_the_gpu(tokens):
    """E 128, H 2048, I 768, k 8, bf16 activations: within bf16 rounding of the dequantized reference, through the
    default configuration (scan at decode sizes, sorted above) and the invariant one."""
    dev, num_experts, top_k, hidden, inter = "cuda", 128, 8, 2048, 768
    gen = torch.Generator().manual_seed(tokens)
    w13, s13 = quantize_blocks((torch.randn(num_experts, 2 * inter, hidden, generator=gen) * hidden**-0.5).to(dev))
    w2, s2 = quantize_blocks((torch.randn(num_experts, hidden, inter, generator=gen) * inter**-0.5).to(dev))
    x = torch.randn(tokens, hidden, generator=gen).to(dev, torch.bfloat16)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)]).int().to(dev)
    weights = torch.rand(tokens, top_k, generator=gen).to(dev)
    ids[0], weights[0] = num_experts, 0.0  # a padded row
    ref = fused_moe_reference(x, w13, w2, ids, weights, s13, s2)
    for invariant in (False, True):
        out = fused_moe(x, w13, w2, ids, weights, invariant=invariant, w13_scale=s13, w2_scale=s2)
        assert not out.isnan().any() and (out[:, 0] == 0).all()
        assert (out - ref).abs().max() <= 0.05 * ref.abs().max(), invariant
