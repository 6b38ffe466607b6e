import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from qwen3_runtime.config import ModelConfig
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.loader import CheckpointError, _weight_bytes, load_model
from qwen3_runtime.models.qwen3_config import Qwen3Config
from qwen3_runtime.models.qwen3_moe_config import Qwen3MoeConfig
from qwen3_runtime.quantization import WeightFormat


def _load(path):
    return load_model(ModelConfig(path=str(path)), torch.device("cpu"), torch.float32)


def _edit(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_fused_projections_hold_the_checkpoint_tensors(tiny_checkpoint):
    model = _load(tiny_checkpoint)
    tensors = load_file(tiny_checkpoint / "model.safetensors")
    attn = model.model.layers[1].self_attn
    q_size, kv_size = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    q, k, v = attn.qkv_proj.weight.split([q_size, kv_size, kv_size])
    assert torch.equal(k, tensors["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(v, tensors["model.layers.1.self_attn.v_proj.weight"])
    up = model.model.layers[0].mlp.gate_up_proj.weight.chunk(2)[1]
    assert torch.equal(up, tensors["model.layers.0.mlp.up_proj.weight"])
    assert model.lm_head_is_tied


def test_sharded_untied_checkpoint(make_checkpoint):
    path = make_checkpoint(tie_word_embeddings=False, max_shard_size="100KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = _load(path)
    assert not model.lm_head_is_tied
    shard = path / index["weight_map"]["lm_head.weight"]
    assert torch.equal(model.lm_head.weight, load_file(shard)["lm_head.weight"])


def test_tied_checkpoint_holding_lm_head_shares_one_tensor(make_checkpoint):
    """Qwen3-0.6B and 1.7B tie their embeddings yet store lm_head.weight too: one tensor, as in transformers."""
    path = make_checkpoint()
    _edit(path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    model = _load(path)
    assert model.lm_head_is_tied
    _edit(path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
    model = _load(path)  # transformers too keeps an lm_head that differs, untied
    assert not model.lm_head_is_tied
    assert torch.equal(model.lm_head.weight, load_file(path / "model.safetensors")["lm_head.weight"])


def test_index_naming_no_file_is_an_error(make_checkpoint):
    path = make_checkpoint(max_shard_size="100KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = 3
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"index.json: weight_map\['model.norm.weight'\]=3 is not a file name"):
        _load(path)


def test_missing_unexpected_and_misshaped_tensors_are_named(make_checkpoint):
    path = make_checkpoint()
    original = load_file(path / "model.safetensors")
    _edit(path, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.1.self_attn.k_norm.weight'"):
        _load(path)
    _edit(path, lambda t: t.update(original, **{"model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        _load(path)
    _edit(
        path,
        lambda t: (t.clear(), t.update(original, **{"model.layers.0.self_attn.v_proj.weight": torch.zeros(3, 64)})),
    )
    with pytest.raises(
        CheckpointError,
        match=r"'model.layers.0.self_attn.v_proj.weight' in model.safetensors has shape \(3, 64\), expected \(48, 64\)",
    ):
        _load(path)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.float8_e4m3fn])
def test_integer_or_8_bit_tensor_is_an_error(make_checkpoint, dtype):
    """Refused rather than cast into the weights: an integer or 8-bit tensor is corrupt or needs scales."""
    path = make_checkpoint()
    _edit(path, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(dtype)}))
    with pytest.raises(CheckpointError, match=rf"'model.norm.weight' in model.safetensors has dtype {dtype}"):
        _load(path)


def _small() -> Qwen3Config:
    """A shape for random weights: one layer, so the parameter list below reads whole."""
    return Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )


def test_random_weights_are_seeded_and_respect_tying():
    a = load_model(ModelConfig(architecture=_small(), seed=3), torch.device("cpu"), torch.float32)
    b = load_model(ModelConfig(architecture=_small(), seed=3), torch.device("cpu"), torch.float32)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not a.lm_head_is_tied and a.model.norm.weight.eq(1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parameters_and_seeded_weights_are_pinned(dtype):
    """Names, order, shapes and dtypes are the state dict's contract; the order is also the seeded weights' (one
    generator drawing N(0, 0.02) parameter by parameter, norms 1): benchmarks and random-weight tests rely on both."""
    model = load_model(ModelConfig(architecture=_small(), seed=5), torch.device("cpu"), dtype)
    layer = [
        ("input_layernorm", (16,)),
        ("self_attn.qkv_proj", (32, 16)),
        ("self_attn.o_proj", (16, 16)),
        ("self_attn.q_norm", (8,)),
        ("self_attn.k_norm", (8,)),
        ("post_attention_layernorm", (16,)),
        ("mlp.gate_up_proj", (64, 16)),
        ("mlp.down_proj", (16, 32)),
    ]
    expected = [
        ("model.embed_tokens.weight", (64, 16)),
        *((f"model.layers.0.{name}.weight", shape) for name, shape in layer),
        ("model.norm.weight", (16,)),
        ("lm_head.weight", (64, 16)),
    ]
    params = list(model.named_parameters())
    assert [(name, tuple(p.shape)) for name, p in params] == expected
    assert {p.dtype for _, p in params} == {dtype}
    gen = torch.Generator().manual_seed(5)
    for name, p in params:
        drawn = (
            torch.empty_like(p).fill_(1.0)
            if name.endswith("norm.weight")
            else torch.empty_like(p).normal_(0.0, 0.02, generator=gen)
        )
        assert torch.equal(p, drawn), name


def test_moe_parameters_are_pinned_and_their_bytes_counted_before_building():
    """A sparse layer's router and stacked experts, a dense layer's MLP, in this order; the bytes counted from one
    layer of each kind are the built model's."""
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, norm_topk_prob=True)
    arch = Qwen3MoeConfig(**vars(_small()) | {"num_hidden_layers": 3}, **moe, mlp_only_layers=[1])
    model = load_model(ModelConfig(architecture=arch, seed=5), torch.device("cpu"), torch.float32)
    params = [(name, tuple(p.shape)) for name, p in model.named_parameters()]

    def layer(i):
        return [(name.removeprefix(f"model.layers.{i}."), shape) for name, shape in params if f".{i}." in name]

    assert layer(0)[5:] == [
        ("post_attention_layernorm.weight", (16,)),
        ("mlp.gate.weight", (4, 16)),
        ("mlp.experts.w13_weight", (4, 16, 16)),
        ("mlp.experts.w2_weight", (4, 16, 8)),
    ]
    assert layer(1)[5:] == [
        ("post_attention_layernorm.weight", (16,)),
        ("mlp.gate_up_proj.weight", (64, 16)),
        ("mlp.down_proj.weight", (16, 32)),
    ]
    assert layer(2) == layer(0) and len(params) == 2 + 9 + 8 + 9 + 1
    for shape in (
        arch,
        dataclasses.replace(arch, mlp_only_layers=[]),
        dataclasses.replace(arch, mlp_only_layers=[0, 1, 2]),
        dataclasses.replace(arch, tie_word_embeddings=True, decoder_sparse_step=2),
    ):
        model = load_model(ModelConfig(architecture=shape), torch.device("cpu"), torch.float32)
        held = sum(p.nbytes for p in model.parameters())  # a tied lm_head once
        assert _weight_bytes(type(model), shape, LayerBuild(torch.float32)) == held


def test_fp8_weights_and_their_scales_are_counted_before_building():
    """model.quantization: fp8 on random weights: every projection e4m3 with its fp32 scales, the bytes counted from
    one layer of each kind the built model's."""
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, norm_topk_prob=True)
    arch = Qwen3MoeConfig(**vars(_small()) | {"num_hidden_layers": 3}, **moe, mlp_only_layers=[1])
    model = load_model(ModelConfig(architecture=arch, quantization="fp8"), torch.device("cpu"), torch.float32)
    fp8 = [name for name, p in model.named_parameters() if p.dtype == torch.float8_e4m3fn]
    assert len(fp8) == 3 * 4 and all(name.endswith(("proj.weight", "w13_weight", "w2_weight")) for name in fp8)
    held = sum(p.nbytes for p in model.parameters())
    assert _weight_bytes(type(model), arch, LayerBuild(torch.float32, WeightFormat("fp8"))) == held


def test_untied_checkpoint_without_lm_head_is_an_error(make_checkpoint):
    path = make_checkpoint(tie_word_embeddings=False)
    _edit(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'lm_head.weight'.*tie_word_embeddings: false"):
        _load(path)


@pytest.mark.parametrize("keep", [0, 0.5])
def test_empty_or_truncated_safetensors_names_the_file(tiny_checkpoint, copy_checkpoint, keep):
    path = copy_checkpoint(tiny_checkpoint)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a readable safetensors file"):
        _load(path)


def test_moe_checkpoint_errors_name_the_expert_tensor(make_checkpoint, copy_checkpoint):
    """A missing expert, an expert more than config.json counts, and a router of another expert count."""
    path = make_checkpoint(num_hidden_layers=2, moe=dict(num_experts=5, num_experts_per_tok=2, moe_intermediate_size=8))
    original = load_file(path / "model.safetensors")
    _edit(path, lambda t: t.pop("model.layers.1.mlp.experts.3.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.1.mlp.experts.3.up_proj.weight'"):
        _load(path)
    _edit(path, lambda t: t.update(original))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model.layers.0.mlp.experts.4.down_proj.weight'"):
        _load(copy_checkpoint(path, num_local_experts=4))
    router = "model.layers.0.mlp.gate.weight"
    _edit(path, lambda t: t.update({router: torch.zeros(4, 64)}))
    with pytest.raises(
        CheckpointError, match=rf"'{router}' in model.safetensors has shape \(4, 64\), expected \(5, 64\)"
    ):
        _load(path)
