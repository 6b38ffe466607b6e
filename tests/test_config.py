from dataclasses import replace

import numpy as np
import pytest

from qwen3_runtime.config import ConfigError, bundled_configs, load_config, parse_override


def test_every_bundled_config_loads():
    names = bundled_configs()
    assert {"tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.model.path is None and cfg.model.architecture is not None


def test_sizes_match_the_published_shapes():
    arch = load_config("qwen3-4b").model.architecture
    assert (arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers) == (2560, 9728, 36)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == (32, 8, 128)
    assert arch.tie_word_embeddings and not load_config("qwen3-8b").model.architecture.tie_word_embeddings


def test_overrides_from_python_and_cli_text():
    cfg = load_config("tiny", {"logprobs.path": "host", "engine.max_num_seqs": 3})
    assert cfg.logprobs.path == "host" and cfg.engine.max_num_seqs == 3
    assert parse_override("logprobs.path=host") == ("logprobs.path", "host")
    assert parse_override("engine.num_kv_blocks=null") == ("engine.num_kv_blocks", None)
    assert parse_override("generate.prompts=[[1,2],[3]]") == ("generate.prompts", [[1, 2], [3]])


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"logprobs.pathh": "host"}, ["logprobs.pathh"]),
        ({"engine.bogus": 1}, ["engine.bogus"]),
        ({"logprobs.path": "gpu"}, ["logprobs.path", "'gpu'", "device", "host"]),
        ({"engine.block_size": "16"}, ["engine.block_size", "'16'", "int"]),
        ({"engine.max_num_seqs": 0}, ["engine.max_num_seqs", "0", "[1, 2147483647]"]),
        (
            {"engine.gpu_memory_utilization": 1.5},
            ["engine.gpu_memory_utilization=1.5 is out of range: must be in (0, 1]"],
        ),
        ({"engine.max_num_batched_tokens": 0}, ["engine.max_num_batched_tokens", "0", "[1, 2147483647]"]),
        ({"engine.max_num_batched_tokens": 4}, ["engine.max_num_batched_tokens=4", ">= max_num_seqs=8"]),
        ({"engine.prefix_caching": "yes"}, ["engine.prefix_caching", "'yes'", "bool"]),
        ({"logprobs.max_logprobs": -2}, ["logprobs.max_logprobs", "-2", "[-1, 2147483647]"]),
        ({"model.architecture.num_key_value_heads": 3}, ["model.architecture.num_attention_heads", "3"]),
        ({"generate.sampling.temperature": -1}, ["generate.sampling.temperature", "-1", ">= 0"]),
        ({"generate.sampling.top_p": 0}, ["generate.sampling.top_p", "(0, 1]"]),
        ({"generate.prompts": [[1, "x"]]}, ["generate.prompts[0][1]", "'x'"]),
        ({"model.architecture": None}, ["model.path", "model.architecture"]),
        ({"engine.device": "tpu"}, ["engine.device", "tpu"]),
        ({"model.quantization": "int8"}, ["model.quantization='int8' is invalid: allowed values are fp8"]),
        ({"model.architecture.hidden_size": 2**63}, ["model.architecture.hidden_size", "[1, 2147483647]"]),
        ({"engine.num_kv_blocks": 2**31}, ["engine.num_kv_blocks=2147483648", "[1, 2147483647]"]),
        ({"model.seed": 2**64}, ["model.seed", "[0, 9223372036854775807]"]),
        # tiny's EOS ids are Qwen3's: a smaller vocabulary must name its own
        ({"model.architecture.vocab_size": 1000}, ["model.architecture.eos_token_id=[151645, 151643]", "[0, 1000)"]),
    ],
)
def test_bad_values_name_the_dotted_key(overrides, words):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_a_step_holds_at_most_every_sequence_at_full_length():
    """So a budget far past it sizes no buffer past it."""
    assert load_config("tiny", {"engine.max_model_len": 256}).engine.max_step_tokens == 1024
    huge_budget = {"engine.max_model_len": 256, "engine.max_num_batched_tokens": 10**8}
    assert load_config("tiny", huge_budget).engine.max_step_tokens == 8 * 256


@pytest.mark.parametrize("name", bundled_configs())
def test_bundled_configs_leave_max_model_len_to_the_model(name):
    """So a checkpoint given as model.path serves its own context (Runtime resolves it, capped by the KV cache)."""
    assert load_config(name).engine.max_model_len is None


def test_bad_override_text_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("logprobs.path")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_file_with_unknown_top_level_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  path: /x\nserver:\n  port: 1\n")
    with pytest.raises(ConfigError, match="unknown config key server"):
        load_config(path)


@pytest.mark.parametrize(
    "key, text",
    [
        ("model.architecture.rms_norm_eps", ".nan"),
        ("model.architecture.rope_theta", ".inf"),
        ("engine.gpu_memory_utilization", ".nan"),
        ("engine.gpu_memory_utilization", "-.inf"),
        ("generate.sampling.temperature", ".inf"),
        ("generate.sampling.top_p", ".nan"),
    ],
)
def test_non_finite_values_are_rejected(key, text):
    _, value = parse_override(f"{key}={text}")
    with pytest.raises(ConfigError) as err:
        load_config("tiny", {key: value})
    assert str(err.value) == f"{key}={value!r} is invalid: expected a finite number"


def test_numpy_scalars_from_python_overrides_are_plain_numbers():
    cfg = load_config("tiny", {"engine.max_num_seqs": np.int64(3), "engine.gpu_memory_utilization": np.float32(0.5)})
    assert type(cfg.engine.max_num_seqs) is int and cfg.engine.max_num_seqs == 3
    assert type(cfg.engine.gpu_memory_utilization) is float and cfg.engine.gpu_memory_utilization == 0.5
    with pytest.raises(ConfigError, match=r"^engine.max_num_seqs=True is invalid: expected an integer$"):
        load_config("tiny", {"engine.max_num_seqs": True})


def test_bundled_configs_found_in_an_installed_layout(tmp_path, monkeypatch):
    """A wheel puts configs/ inside the package, beside config.py, with no configs/ above it."""
    import importlib.util
    import shutil
    import sys

    import qwen3_runtime.config as source

    package = tmp_path / "site-packages" / "qwen3_runtime"
    shutil.copytree(source._bundled_dir(), package / "configs")
    shutil.copy(source.__file__, package / "config.py")
    spec = importlib.util.spec_from_file_location("installed_config", package / "config.py")
    installed = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "installed_config", installed)  # dataclasses look their module up
    spec.loader.exec_module(installed)
    assert installed._bundled_dir() == package / "configs"
    assert "tiny" in installed.bundled_configs()
    assert installed.load_config("tiny").model.architecture.vocab_size == 151936


@pytest.mark.parametrize("name", ["qwen3-4b", "qwen3-30b-a3b"])
def test_fp8_configs_are_their_shape_in_fp8(name):
    fp8, base = load_config(f"{name}-fp8"), load_config(name)
    assert fp8.model.quantization == "fp8" and base.model.quantization is None
    assert replace(fp8, model=replace(fp8.model, quantization=None)) == base
