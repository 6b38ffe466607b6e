import pytest

from qwen3_runtime.config import ConfigError, load_config
from qwen3_runtime.models.registry import FAMILIES, family_of, resolve_family


@pytest.mark.parametrize("hf", [{}, {"model_type": "qwen3"}, {"architectures": ["Qwen3ForCausalLM"]}])
def test_qwen3_is_resolved_and_the_default(hf):
    """A config.json without model_type has always been read as Qwen3's."""
    assert resolve_family(hf, "config.json") is FAMILIES[0]


def test_an_unknown_model_type_names_the_supported_ones():
    with pytest.raises(
        ConfigError, match=r"^c.json: model_type='qwen2_moe' is not supported \(supported: 'qwen3', 'qwen3_moe'\)$"
    ):
        resolve_family({"model_type": "qwen2_moe"}, "c.json")


def test_qwen3_moe_is_resolved_by_model_type_and_its_architecture_alone():
    family = resolve_family({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}, "c.json")
    assert family.name == "qwen3_moe"
    with pytest.raises(
        ConfigError, match=r"architectures=\['Qwen3ForCausalLM'\] is not supported for model_type='qwen3_moe'"
    ):
        resolve_family({"model_type": "qwen3_moe", "architectures": ["Qwen3ForCausalLM"]}, "c.json")


@pytest.mark.parametrize(
    "config, name, config_cls, model_cls",
    [
        ("tiny", "qwen3", "qwen3_config:Qwen3Config", "qwen3:Qwen3ForCausalLM"),
        ("tiny-moe", "qwen3_moe", "qwen3_moe_config:Qwen3MoeConfig", "qwen3_moe:Qwen3MoeForCausalLM"),
    ],
)
def test_a_shape_finds_its_family_and_its_classes(config, name, config_cls, model_cls):
    """By its exact type: Qwen3MoeConfig is a Qwen3Config too."""
    family = family_of(load_config(config).model.architecture)
    classes = (family.config_cls(), family.model_cls())
    assert family.name == name
    assert [f"{c.__module__.rpartition('.')[2]}:{c.__name__}" for c in classes] == [config_cls, model_cls]
