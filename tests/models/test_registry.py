import pytest

from qwen3_runtime.config import ConfigError, load_config
from qwen3_runtime.models.qwen3_config import Qwen3Config
from qwen3_runtime.models.registry import FAMILIES, family_of, resolve_family


@pytest.mark.parametrize("hf", [{}, {"model_type": "qwen3"}, {"architectures": ["Qwen3ForCausalLM"]}])
def test_qwen3_is_resolved_and_the_default(hf):
    """A config.json without model_type has always been read as Qwen3's."""
    assert resolve_family(hf, "config.json") is FAMILIES[0]


def test_an_unknown_model_type_names_the_supported_ones():
    with pytest.raises(ConfigError, match=r"^c.json: model_type='qwen2_moe' is not supported \(supported: 'qwen3'\)$"):
        resolve_family({"model_type": "qwen2_moe"}, "c.json")


def test_a_shape_finds_its_family_and_its_classes():
    from qwen3_runtime.models.qwen3 import Qwen3ForCausalLM

    family = family_of(load_config("tiny").model.architecture)
    assert (family.name, family.config_cls(), family.model_cls()) == ("qwen3", Qwen3Config, Qwen3ForCausalLM)
