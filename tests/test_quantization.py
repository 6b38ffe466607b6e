"""Which projections are FP8: config.json's quantization_config (Qwen's FP8 checkpoints), model.quantization, and the
rule by which modules_to_not_convert keeps a module in 16 bits."""

import json

import pytest

from qwen3_runtime.config import ModelConfig, load_config
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.models.hf_config import model_weight_format
from qwen3_runtime.quantization import WeightFormat
from tests.fp8_checkpoints import edit_config, quantization_config

# Qwen3-30B-A3B-FP8's list, as quoted (lm_head, and each layer's norms and router), for its first two layers.
QWEN_LIST = ["lm_head"] + [
    f"model.layers.{i}.{name}" for i in range(2) for name in ("input_layernorm", "mlp.gate", "post_attention_layernorm")
]


@pytest.mark.parametrize(
    "entries, fp8",
    [
        ([], True),
        (QWEN_LIST, True),  # the router's name is no prefix of gate_proj's, by segments
        (["model.layers.1.mlp.gate_proj"], False),  # the full name (vLLM's default, exact match)
        (["mlp.gate_proj"], False),
        (["layers.1.mlp"], False),  # a parent module
        (["mlp"], False),
        (["layers.1"], False),
        (["layers.10"], True),
        (["model.layers.1.mlp.gate"], True),
        (["gate"], True),
        (["gate_pro"], True),
    ],
)
def test_modules_to_not_convert_match_whole_name_segments(entries, fp8):
    assert WeightFormat("fp8", tuple(entries)).fp8("model.layers.1.mlp.gate_proj") is fp8


def test_without_quantization_nothing_is_fp8():
    assert not WeightFormat().fp8("model.layers.0.self_attn.q_proj")


def test_the_build_names_each_module_as_the_checkpoint_does():
    build = LayerBuild(None, WeightFormat("fp8", ("layers.3.self_attn",))).at("model").at("layers.3")
    assert build.prefix == "model.layers.3."
    assert not build.at("self_attn").fp8("q_proj", "k_proj", "v_proj") and build.at("mlp").fp8("gate_proj", "up_proj")


def test_random_weights_take_model_quantization():
    assert model_weight_format(load_config("tiny").model) == WeightFormat()
    assert model_weight_format(load_config("tiny", {"model.quantization": "fp8"}).model) == WeightFormat("fp8")


def test_a_checkpoint_declares_its_format_and_model_quantization_agrees_or_quantizes_at_load(
    tiny_checkpoint, copy_checkpoint
):
    fp8 = copy_checkpoint(tiny_checkpoint)
    edit_config(fp8, quantization_config=quantization_config(QWEN_LIST))
    source = f"quantization_config of {fp8 / 'config.json'}"
    declared = WeightFormat("fp8", tuple(QWEN_LIST), from_checkpoint=True, declared_by=source)
    for quantization in (None, "fp8"):  # null: as the checkpoint declares; fp8: the same
        assert model_weight_format(ModelConfig(path=str(fp8), quantization=quantization)) == declared
    assert model_weight_format(ModelConfig(path=str(tiny_checkpoint))) == WeightFormat()
    assert model_weight_format(ModelConfig(path=str(tiny_checkpoint), quantization="fp8")) == WeightFormat("fp8")


def test_a_null_quantization_config_is_none(tiny_checkpoint, copy_checkpoint):
    """As transformers writes it for a model it did not quantize."""
    path = copy_checkpoint(tiny_checkpoint)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": None}))
    assert model_weight_format(ModelConfig(path=str(path))) == WeightFormat()
