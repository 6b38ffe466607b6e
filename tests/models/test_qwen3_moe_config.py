"""Qwen3-MoE's shape: from config.json (both spellings of the expert count, transformers' defaults, the key policy),
from YAML (a union with the dense shape), and which layers are sparse."""

import dataclasses
import json
import re

import pytest

from qwen3_runtime.config import ConfigError, load_config
from qwen3_runtime.models.hf_config import read_architecture
from qwen3_runtime.models.qwen3_config import Qwen3Config
from qwen3_runtime.models.qwen3_moe_config import Qwen3MoeConfig


def test_reads_transformers_5s_config_json(tiny_moe_checkpoint):
    """transformers 5.25's save_pretrained writes num_local_experts (and the training-only router keys)."""
    config = json.loads((tiny_moe_checkpoint / "config.json").read_text())
    assert "num_local_experts" in config and "num_experts" not in config and "router_aux_loss_coef" in config
    arch = read_architecture(tiny_moe_checkpoint)
    assert type(arch) is Qwen3MoeConfig
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (8, 3, 40)
    assert (arch.norm_topk_prob, arch.decoder_sparse_step, arch.mlp_only_layers) == (True, 1, [1])


def test_qwens_released_spelling_and_both_when_equal(tiny_moe_checkpoint, copy_checkpoint):
    released = read_architecture(copy_checkpoint(tiny_moe_checkpoint, num_local_experts=None, num_experts=8))
    both = read_architecture(copy_checkpoint(tiny_moe_checkpoint, num_experts=8))
    assert released == both == read_architecture(tiny_moe_checkpoint)


def test_absent_keys_take_transformers_defaults(tiny_moe_checkpoint, copy_checkpoint):
    """Qwen3MoeConfig has no head_dim default (hidden_size / heads), and does not renormalise by default."""
    import transformers

    absent = dict.fromkeys(("head_dim", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"))
    path = copy_checkpoint(tiny_moe_checkpoint, **absent)
    theirs, arch = transformers.AutoConfig.from_pretrained(path), read_architecture(path)
    assert arch.head_dim == theirs.hidden_size // theirs.num_attention_heads == 16
    assert (arch.norm_topk_prob, arch.decoder_sparse_step, arch.mlp_only_layers) == (False, 1, [])
    assert (theirs.norm_topk_prob, theirs.decoder_sparse_step, theirs.mlp_only_layers) == (False, 1, [])


@pytest.mark.parametrize(
    "edits, message",
    [
        ({"num_experts": 7}, "num_experts=7 and num_local_experts=8 differ"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok=9 is out of range: must be <= num_experts=8"),
        ({"num_local_experts": 0}, "num_experts=0 is out of range"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size=0 is out of range"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step=0 is out of range"),
        ({"mlp_only_layers": [3]}, "mlp_only_layers=[3] is out of range: each index must be in [0, 3) (num_hidden_"),
        ({"mlp_only_layers": [-1]}, "mlp_only_layers=[-1] is out of range"),
        ({"num_local_experts": None}, "missing config key num_experts"),
        ({"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size is not honoured by the qwen3_moe"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"architectures": ["Qwen3ForCausalLM"]}, "(supported: 'Qwen3MoeForCausalLM')"),
    ],
)
def test_bad_or_unsupported_config_json_is_named(tiny_moe_checkpoint, copy_checkpoint, edits, message):
    path = copy_checkpoint(tiny_moe_checkpoint, **edits) / "config.json"
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: .*{re.escape(message)}"):
        read_architecture(path.parent)


def test_training_only_keys_are_accepted(tiny_moe_checkpoint, copy_checkpoint):
    path = copy_checkpoint(tiny_moe_checkpoint, output_router_logits=True, router_aux_loss_coef=0.5)
    assert read_architecture(path) == read_architecture(tiny_moe_checkpoint)


def _shape(**moe) -> Qwen3MoeConfig:
    base = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, norm_topk_prob=True)
    return Qwen3MoeConfig(**base, **experts, **moe)


@pytest.mark.parametrize("layers", [1, 5, 8])
@pytest.mark.parametrize("step", [1, 2, 3, 9])
@pytest.mark.parametrize("mlp_only", [[], [0], [1, 4], [0, 2, 2]])
def test_sparse_layers_follow_transformers_rule(layers, step, mlp_only):
    """transformers' Qwen3MoeDecoderLayer: sparse iff not in mlp_only_layers and (index + 1) % step == 0. The layer
    samples hold one layer of each kind present, sparse first, and count them."""
    mlp_only = [i for i in mlp_only if i < layers]
    arch = _shape(num_hidden_layers=layers, decoder_sparse_step=step, mlp_only_layers=mlp_only)
    sparse = [i not in mlp_only and (i + 1) % step == 0 for i in range(layers)]
    assert [arch.is_sparse_layer(i) for i in range(layers)] == sparse
    assert arch.num_sparse_layers == sum(sparse)
    sample, counts = arch.layer_samples()
    kinds = [kind for kind in (True, False) if kind in sparse]
    assert [sample.is_sparse_layer(i) for i in range(sample.num_hidden_layers)] == kinds
    assert counts == tuple(sparse.count(kind) for kind in kinds)


def test_yaml_builds_the_shape_its_keys_name():
    assert type(load_config("tiny").model.architecture) is Qwen3Config
    arch = load_config("tiny-moe").model.architecture
    assert type(arch) is Qwen3MoeConfig and arch.num_sparse_layers == 3 and not arch.is_sparse_layer(1)


@pytest.mark.parametrize(
    "config, overrides, message",
    [
        ("tiny", {"hidden_sizee": 8}, "unknown config key model.architecture.hidden_sizee; allowed in"),
        ("tiny-moe", {"num_expert_per_tok": 2}, "unknown config key model.architecture.num_expert_per_tok; allowed"),
        ("tiny-moe", {"num_experts_per_tok": 9}, "model.architecture.num_experts_per_tok=9 is out of range"),
        ("tiny-moe", {"norm_topk_prob": "yes"}, "model.architecture.norm_topk_prob='yes' is invalid: expected bool"),
        ("tiny-moe", {"mlp_only_layers": [4]}, "model.architecture.mlp_only_layers=[4] is out of range"),
        ("tiny-moe", {"num_key_value_heads": 3}, "model.architecture.num_attention_heads=4 must be a multiple"),
    ],
)
def test_a_yaml_mistake_is_named_in_either_shape(config, overrides, message):
    """The shape whose keys the mapping uses is built alone, so its own error comes out, not the other's."""
    raw = {f"model.architecture.{key}": value for key, value in overrides.items()}
    with pytest.raises(ConfigError) as err:
        load_config(config, raw)
    assert str(err.value).startswith(message), str(err.value)
    if "allowed" in message:  # against the shape it meant
        assert ("num_experts" in str(err.value)) == (config == "tiny-moe")


def test_published_moe_shapes():
    small, large = (load_config(name).model.architecture for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"))
    assert (small.hidden_size, small.moe_intermediate_size, small.num_hidden_layers) == (2048, 768, 48)
    assert (large.hidden_size, large.moe_intermediate_size, large.num_hidden_layers) == (4096, 1536, 94)
    for arch in (small, large):
        assert (arch.num_experts, arch.num_experts_per_tok, arch.norm_topk_prob) == (128, 8, True)
        assert arch.num_sparse_layers == arch.num_hidden_layers and not arch.tie_word_embeddings
    assert [(a.num_attention_heads, a.num_key_value_heads, a.intermediate_size) for a in (small, large)] == [
        (32, 4, 6144),
        (64, 4, 12288),
    ]


def test_norm_topk_prob_is_required_in_yaml():
    """The released models renormalise and transformers' default does not: a shape must say which."""
    arch = load_config("tiny-moe").model.architecture
    raw = {f.name: getattr(arch, f.name) for f in dataclasses.fields(arch) if f.name != "norm_topk_prob"}
    with pytest.raises(ConfigError, match=r"^missing config key model.architecture.norm_topk_prob"):
        load_config("tiny-moe", {"model.architecture": raw})
