import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from qwen3_runtime.config import ArchitectureConfig, ConfigError, ModelConfig
from qwen3_runtime.loader import CheckpointError, load_model, read_architecture, read_sampling_defaults
from qwen3_runtime.models.qwen3_config import RopeScaling


def _load(path):
    return load_model(ModelConfig(path=str(path)), torch.device("cpu"), torch.float32)


def _edit(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_reads_shape_from_config_json(tiny_checkpoint):
    arch = read_architecture(tiny_checkpoint)
    assert (arch.hidden_size, arch.head_dim, arch.num_key_value_heads, arch.vocab_size) == (64, 24, 2, 512)


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


def test_random_weights_are_seeded_and_respect_tying():
    arch = ArchitectureConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    a = load_model(ModelConfig(architecture=arch, seed=3), torch.device("cpu"), torch.float32)
    b = load_model(ModelConfig(architecture=arch, seed=3), torch.device("cpu"), torch.float32)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not a.lm_head_is_tied and a.model.norm.weight.eq(1).all()


def _copy(checkpoint, tmp_path, **config_edits):
    """A copy of `checkpoint` whose config.json has `config_edits` applied (None deletes the key)."""
    path = tmp_path / "ckpt"
    shutil.copytree(checkpoint, path)
    config = json.loads((path / "config.json").read_text())
    config.update(config_edits)
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return path


@pytest.mark.parametrize(
    "own, generation, expected",
    [(7, {"eos_token_id": [9, 7]}, (7, 9)), (None, {"eos_token_id": 5}, (5,)), (7, None, (7,)), ([3, 4], {}, (3, 4))],
)
def test_eos_ids_merge_generation_config(tiny_checkpoint, tmp_path, own, generation, expected):
    """Qwen3's config.json names <|endoftext|>; generation_config.json adds <|im_end|>, the end of a turn."""
    path = _copy(tiny_checkpoint, tmp_path, eos_token_id=own)
    (path / "generation_config.json").unlink(missing_ok=True)
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    assert read_architecture(path).eos_token_ids == expected


def test_generation_config_eos_outside_the_vocabulary_is_an_error(tiny_checkpoint, tmp_path):
    path = _copy(tiny_checkpoint, tmp_path)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, vocab]}))
    with pytest.raises(ConfigError, match=rf"generation_config.json: eos_token_id=\[1, {vocab}\] is out of range"):
        read_architecture(path)


def test_sampling_defaults_come_from_generation_config(tiny_checkpoint, tmp_path):
    """Qwen3's generation_config.json recommends temperature 0.6, top_k 20, top_p 0.95; do_sample and the ids are
    not sampling fields, and max_new_tokens is max_tokens."""
    path = _copy(tiny_checkpoint, tmp_path)
    qwen3 = {"do_sample": True, "eos_token_id": [1, 2], "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    (path / "generation_config.json").write_text(json.dumps({**qwen3, "max_new_tokens": 64, "min_p": None}))
    assert read_sampling_defaults(path) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 64}
    (path / "generation_config.json").unlink()
    assert read_sampling_defaults(path) == {}


@pytest.mark.parametrize("field, value", [("top_p", 0), ("max_new_tokens", 0), ("temperature", "hot")])
def test_bad_sampling_default_names_the_file_and_key(tiny_checkpoint, tmp_path, field, value):
    path = _copy(tiny_checkpoint, tmp_path)
    (path / "generation_config.json").write_text(json.dumps({field: value}))
    with pytest.raises(ConfigError, match=rf"generation_config.json: {field}: "):
        read_sampling_defaults(path)


@pytest.mark.parametrize("key", ["rope_parameters", "head_dim", "max_position_embeddings"])
def test_absent_config_keys_take_transformers_defaults(tiny_checkpoint, tmp_path, key):
    """A config.json without rope_theta runs with transformers' 10000, not Qwen3's released 1e6 (the logits would
    differ); without head_dim, with 128."""
    import transformers

    path = _copy(tiny_checkpoint, tmp_path, **{key: None})
    theirs = transformers.AutoConfig.from_pretrained(path)
    arch = read_architecture(path)
    assert (arch.rope_theta, arch.head_dim, arch.max_position_embeddings) == (
        theirs.rope_parameters["rope_theta"],
        theirs.head_dim,
        theirs.max_position_embeddings,
    )


def test_untied_checkpoint_without_lm_head_is_an_error(make_checkpoint):
    path = make_checkpoint(tie_word_embeddings=False)
    _edit(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'lm_head.weight'.*tie_word_embeddings: false"):
        _load(path)


def test_yarn_as_qwen3s_model_card_writes_it(tiny_checkpoint, tmp_path):
    """transformers 4's layout, as Qwen3's model card has users add it to config.json: rope_scaling by rope_theta."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    path = _copy(tiny_checkpoint, tmp_path, rope_parameters=None, rope_scaling=yarn, rope_theta=1e6)
    arch = read_architecture(path)
    assert (arch.rope_scaling, arch.rope_theta, arch.max_context) == (RopeScaling(**yarn), 1e6, 131072)
    path = _copy(tiny_checkpoint, tmp_path / "null", rope_parameters=None, rope_scaling=None)
    assert read_architecture(path).rope_scaling is None


def test_yarn_null_truncate_does_not_truncate_as_in_transformers(tiny_checkpoint, tmp_path):
    """transformers reads rope_parameters.get("truncate", True) and vLLM passes it on: null is falsy there."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from qwen3_runtime.model import rope_frequencies

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "truncate": None}
    path = _copy(tiny_checkpoint, tmp_path, rope_parameters={**yarn, "rope_theta": 1e4})
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
    ],
)
def test_unsupported_or_bad_config_json_names_the_key(tiny_checkpoint, tmp_path, edits, words):
    path = _copy(tiny_checkpoint, tmp_path, **edits)
    with pytest.raises(ConfigError) as err:
        read_architecture(path)
    for word in [str(path / "config.json"), *words]:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize("text", ["{", "[1, 2]", ""])
def test_malformed_config_json_names_the_file(tiny_checkpoint, tmp_path, text):
    path = _copy(tiny_checkpoint, tmp_path)
    (path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="config.json"):
        read_architecture(path)


@pytest.mark.parametrize("keep", [0, 0.5])
def test_empty_or_truncated_safetensors_names_the_file(tiny_checkpoint, tmp_path, keep):
    path = _copy(tiny_checkpoint, tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a readable safetensors file"):
        _load(path)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model.path='.*nowhere' is not a directory"):
        read_architecture(tmp_path / "nowhere")
