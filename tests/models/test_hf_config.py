import json

import pytest
import torch

from qwen3_runtime.config import ConfigError
from qwen3_runtime.models.hf_config import read_architecture, read_sampling_defaults
from qwen3_runtime.models.qwen3_config import RopeScaling


def test_reads_shape_from_config_json(tiny_checkpoint):
    arch = read_architecture(tiny_checkpoint)
    assert (arch.hidden_size, arch.head_dim, arch.num_key_value_heads, arch.vocab_size) == (64, 24, 2, 512)


@pytest.mark.parametrize(
    "own, generation, expected",
    [(7, {"eos_token_id": [9, 7]}, (7, 9)), (None, {"eos_token_id": 5}, (5,)), (7, None, (7,)), ([3, 4], {}, (3, 4))],
)
def test_eos_ids_merge_generation_config(tiny_checkpoint, copy_checkpoint, own, generation, expected):
    """Qwen3's config.json names <|endoftext|>; generation_config.json adds <|im_end|>, the end of a turn."""
    path = copy_checkpoint(tiny_checkpoint, eos_token_id=own)
    (path / "generation_config.json").unlink(missing_ok=True)
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    assert read_architecture(path).eos_token_ids == expected


def test_generation_config_eos_outside_the_vocabulary_is_an_error(tiny_checkpoint, copy_checkpoint):
    path = copy_checkpoint(tiny_checkpoint)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, vocab]}))
    with pytest.raises(ConfigError, match=rf"generation_config.json: eos_token_id=\[1, {vocab}\] is out of range"):
        read_architecture(path)


def test_sampling_defaults_come_from_generation_config(tiny_checkpoint, copy_checkpoint):
    """Qwen3's generation_config.json recommends temperature 0.6, top_k 20, top_p 0.95; do_sample and the ids are
    not sampling fields, and max_new_tokens is max_tokens."""
    path = copy_checkpoint(tiny_checkpoint)
    qwen3 = {"do_sample": True, "eos_token_id": [1, 2], "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    (path / "generation_config.json").write_text(json.dumps({**qwen3, "max_new_tokens": 64, "min_p": None}))
    assert read_sampling_defaults(path) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 64}
    (path / "generation_config.json").unlink()
    assert read_sampling_defaults(path) == {}


@pytest.mark.parametrize("field, value", [("top_p", 0), ("max_new_tokens", 0), ("temperature", "hot")])
def test_bad_sampling_default_names_the_file_and_key(tiny_checkpoint, copy_checkpoint, field, value):
    path = copy_checkpoint(tiny_checkpoint)
    (path / "generation_config.json").write_text(json.dumps({field: value}))
    with pytest.raises(ConfigError, match=rf"generation_config.json: {field}: "):
        read_sampling_defaults(path)


@pytest.mark.parametrize("key", ["rope_parameters", "head_dim", "max_position_embeddings"])
def test_absent_config_keys_take_transformers_defaults(tiny_checkpoint, copy_checkpoint, key):
    """A config.json without rope_theta runs with transformers' 10000, not Qwen3's released 1e6 (the logits would
    differ); without head_dim, with 128."""
    import transformers

    path = copy_checkpoint(tiny_checkpoint, **{key: None})
    theirs = transformers.AutoConfig.from_pretrained(path)
    arch = read_architecture(path)
    assert (arch.rope_theta, arch.head_dim, arch.max_position_embeddings) == (
        theirs.rope_parameters["rope_theta"],
        theirs.head_dim,
        theirs.max_position_embeddings,
    )


def test_yarn_as_qwen3s_model_card_writes_it(tiny_checkpoint, copy_checkpoint):
    """transformers 4's layout, as Qwen3's model card has users add it to config.json: rope_scaling by rope_theta."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    path = copy_checkpoint(tiny_checkpoint, rope_parameters=None, rope_scaling=yarn, rope_theta=1e6)
    arch = read_architecture(path)
    assert (arch.rope_scaling, arch.rope_theta, arch.max_context) == (RopeScaling(**yarn), 1e6, 131072)
    path = copy_checkpoint(tiny_checkpoint, rope_parameters=None, rope_scaling=None)
    assert read_architecture(path).rope_scaling is None


def test_yarn_null_truncate_does_not_truncate_as_in_transformers(tiny_checkpoint, copy_checkpoint):
    """transformers reads rope_parameters.get("truncate", True) and vLLM passes it on: null is falsy there."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from qwen3_runtime.layers.rotary import rope_frequencies

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "truncate": None}
    path = copy_checkpoint(tiny_checkpoint, rope_parameters={**yarn, "rope_theta": 1e4})
    arch = read_architecture(path)
    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](transformers.AutoConfig.from_pretrained(path), "cpu")
    ours, _ = rope_frequencies(arch.head_dim, arch.rope_theta, arch.rope_scaling)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "edits, words",
    [
        ({"hidden_act": "gelu"}, ["hidden_act='gelu'", "silu"]),
        ({"attention_bias": True}, ["attention_bias=True"]),
        ({"model_type": "llama"}, ["model_type='llama'", "qwen3"]),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, ["missing config key rope_scaling.factor"]),
        ({"rope_parameters": {"type": "dynamic", "factor": 2.0}}, ["rope_type='dynamic'", "'yarn'"]),
        ({"rope_parameters": {"rope_type": "default", "factor": 2.0}}, ["rope_parameters.factor"]),
        (
            {"rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": 0.5}},
            ["rope_parameters.partial_rotary_factor"],
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 8, "mscale": 1}},
            ["unknown config key rope_scaling.mscale"],
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 8}},
            ["rope_scaling.factor=0.5"],
        ),
        ({"hidden_size": None}, ["missing config key hidden_size"]),
        ({"num_hidden_layers": "2"}, ["num_hidden_layers='2'", "expected an integer"]),
        ({"eos_token_id": "x"}, ["eos_token_id='x'"]),
        ({"use_sliding_window": True}, ["use_sliding_window=True", "False"]),
        ({"layer_types": ["full_attention", "sliding_attention"]}, ["layer_types='sliding_attention'"]),
        ({"architectures": ["Qwen3ForSequenceClassification"]}, ["architectures=", "'Qwen3ForCausalLM'"]),
        ({"architectures": "Qwen3ForCausalLM"}, ["architectures='Qwen3ForCausalLM'"]),
    ],
)
def test_unsupported_or_bad_config_json_names_the_key(tiny_checkpoint, copy_checkpoint, edits, words):
    path = copy_checkpoint(tiny_checkpoint, **edits)
    with pytest.raises(ConfigError) as err:
        read_architecture(path)
    for word in [str(path / "config.json"), *words]:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize("text", ["{", "[1, 2]", ""])
def test_malformed_config_json_names_the_file(tiny_checkpoint, copy_checkpoint, text):
    path = copy_checkpoint(tiny_checkpoint)
    (path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="config.json"):
        read_architecture(path)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model.path='.*nowhere' is not a directory"):
        read_architecture(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "edits, named",
    [
        ({"num_experts": 128, "num_experts_per_tok": 8}, "num_experts, num_experts_per_tok are"),
        ({"shared_expert_intermediate_size": 5632}, "shared_expert_intermediate_size is"),  # Qwen2-MoE's
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor is"),
    ],
)
def test_keys_the_family_does_not_honour_are_refused_by_name(tiny_checkpoint, copy_checkpoint, edits, named):
    """Ignored, each would load a different model than the checkpoint's (quantization_config is read:
    tests/test_quantization.py)."""
    path = copy_checkpoint(tiny_checkpoint, **edits)
    with pytest.raises(ConfigError, match=f"config.json: {named} not honoured by the qwen3 family"):
        read_architecture(path)


def test_null_keys_count_as_absent(tiny_checkpoint, copy_checkpoint):
    path = copy_checkpoint(tiny_checkpoint)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": None, "num_experts": None}))
    assert read_architecture(path) == read_architecture(tiny_checkpoint)


def test_a_released_qwen3_config_json_loads(tiny_checkpoint, copy_checkpoint):
    """Qwen3-0.6B's config.json as transformers 4.51 wrote it (sizes shrunk to the tiny checkpoint's): its
    bookkeeping keys, null sliding_window and rope_scaling, top-level rope_theta, all accepted."""
    released = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 7,
        "head_dim": 24,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
    }
    path = copy_checkpoint(tiny_checkpoint, layer_types=None, rope_parameters=None, dtype=None)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **released}))
    arch = read_architecture(path)
    assert (arch.rope_theta, arch.rope_scaling, arch.eos_token_ids, arch.tie_word_embeddings) == (1e6, None, (7,), True)
