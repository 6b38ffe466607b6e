"""What an FP8 checkpoint may not be: each refusal names the key or the tensor, and nothing is served unquantized."""

import re
import shutil

import pytest
import torch

from qwen3_runtime import ops
from qwen3_runtime.config import ConfigError, ModelConfig
from qwen3_runtime.loader import CheckpointError, load_model
from tests.conftest import TINY_MOE
from tests.fp8_checkpoints import edit_config, edit_tensors, quantization_config


def _load(path):
    return load_model(ModelConfig(path=str(path)), torch.device("cpu"), torch.float32)


@pytest.fixture
def fp8_copy(fp8_checkpoint, tmp_path):
    """A copy of the tiny dense FP8 checkpoint to edit."""
    return shutil.copytree(fp8_checkpoint[0], tmp_path / "fp8")


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("quant_method", "awq", "quantization_config.quant_method='awq' is invalid: allowed values are fp8"),
        ("fmt", "e5m2", "quantization_config.fmt='e5m2' is invalid: allowed values are e4m3"),
        ("activation_scheme", "static", "quantization_config.activation_scheme='static' is invalid"),
        ("weight_block_size", [64, 64], "quantization_config.weight_block_size=[64, 64] is not supported"),
        ("weight_block_size", None, "missing config key quantization_config.weight_block_size"),
        ("ignored_layers", ["lm_head"], "unknown config key quantization_config.ignored_layers"),
    ],
)
def test_quantization_config_other_than_dynamic_e4m3_128_blocks_is_refused(fp8_copy, key, value, words):
    config = {k: v for k, v in (quantization_config([]) | {key: value}).items() if v is not None}
    edit_config(fp8_copy, quantization_config=config)
    with pytest.raises(ConfigError) as err:
        _load(fp8_copy)
    assert str(err.value).startswith(f"{fp8_copy / 'config.json'}: {words}"), str(err.value)


O_PROJ = "model.layers.0.self_attn.o_proj.weight"


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            lambda t: t.update({O_PROJ: t[O_PROJ].float().bfloat16()}),
            rf"tensor '{O_PROJ}' in model.safetensors has dtype torch.bfloat16, expected torch.float8_e4m3fn, as the "
            "quantization_config of .*config.json declares",
        ),
        (
            lambda t: t.update({O_PROJ: t[O_PROJ].float().to(torch.float8_e5m2)}),
            rf"'{O_PROJ}' in model.safetensors has dtype torch.float8_e5m2, expected torch.float8_e4m3fn",
        ),
        (
            lambda t: t.pop("model.layers.1.mlp.up_proj.weight_scale_inv"),
            r"missing tensor 'model.layers.1.mlp.up_proj.weight_scale_inv'",
        ),
        (
            lambda t: t.update({f"{O_PROJ}_scale_inv": torch.ones(3, 2)}),
            rf"'{O_PROJ}_scale_inv' in model.safetensors has shape \(3, 2\), expected \(2, 2\)",
        ),
        (
            lambda t: t.update({f"{O_PROJ}_scale_inv": torch.ones(2, 2).to(torch.float8_e4m3fn)}),
            rf"'{O_PROJ}_scale_inv' in model.safetensors has dtype torch.float8_e4m3fn, expected a 16- or 32-bit",
        ),
        (
            lambda t: t.update({O_PROJ: t["model.layers.0.self_attn.q_proj.weight"].clone()}),
            rf"'{O_PROJ}' in model.safetensors has shape \(256, 160\), expected \(160, 256\)",
        ),
    ],
    ids=["bf16-weight", "e5m2-weight", "missing-scale", "scale-shape", "fp8-scale", "weight-shape"],
)
def test_a_tensor_that_is_not_the_declared_fp8_format_is_named(fp8_copy, edit, words):
    edit_tensors(fp8_copy, edit)
    with pytest.raises(CheckpointError, match=words):
        _load(fp8_copy)


def test_fp8_tensors_without_quantization_config_are_refused(fp8_copy):
    edit_config(fp8_copy, quantization_config=None)
    with pytest.raises(CheckpointError) as err:
        _load(fp8_copy)
    assert re.search(
        r"tensor '.*_proj.weight' in model.safetensors has dtype torch.float8_e4m3fn, expected a 16- or 32-bit float "
        r"\(8-bit weights load only where config.json's quantization_config declares FP8 projections",
        str(err.value),
    ), str(err.value)


def test_an_fp8_tensor_of_a_module_kept_in_16_bits_is_refused(fp8_copy):
    edit_config(fp8_copy, quantization_config=quantization_config(["model.layers.0.self_attn.o_proj"]))
    with pytest.raises(CheckpointError, match=rf"'{O_PROJ}' in model.safetensors has dtype torch.float8_e4m3fn"):
        _load(fp8_copy)


@pytest.mark.parametrize(
    "keep, kept, converted",
    [
        (["model.layers.1.self_attn.k_proj"], "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.q_proj"),
        (["mlp.up_proj"], "model.layers.0.mlp.up_proj", "model.layers.0.mlp.gate_proj"),
    ],
)
def test_modules_to_not_convert_splitting_one_tensor_is_refused(fp8_copy, keep, kept, converted):
    edit_config(fp8_copy, quantization_config=quantization_config(keep))
    with pytest.raises(ConfigError, match=f"modules_to_not_convert in quantization_config of .*config.json keeps "
                       f"{kept} in 16 bits but not {converted}, which one tensor holds with it"):  # fmt: skip
        _load(fp8_copy)


def test_modules_to_not_convert_splitting_a_layers_experts_is_refused(fp8_moe_checkpoint, tmp_path):
    path = shutil.copytree(fp8_moe_checkpoint[0], tmp_path / "fp8")
    edit_config(path, quantization_config=quantization_config(["model.layers.2.mlp.experts.3.down_proj"]))
    with pytest.raises(ConfigError, match="keeps model.layers.2.mlp.experts.3.down_proj in 16 bits but not "
                       "model.layers.2.mlp.experts.0.gate_proj"):  # fmt: skip
        _load(path)


@pytest.mark.parametrize(
    "shape, tensor",
    [
        ({"intermediate_size": 256}, "model.layers.0.self_attn.k_proj.weight"),
        ({}, "model.layers.0.mlp.gate_proj.weight"),
        (TINY_MOE, "model.layers.0.mlp.experts.0.gate_proj.weight"),
    ],
    ids=["qkv-of-96-48-48-rows", "gate-up-of-136-rows", "experts-gate-up-of-40-rows"],
)
def test_fused_parts_that_are_not_whole_blocks_are_refused(make_fp8_checkpoint, shape, tensor):
    """The tiny shapes' fused parts, refused at the first in the file (a last part's partial block would straddle
    nothing, but Qwen3's parts come in equal pairs or q, k, v of whole heads: the rule is kept simple)."""
    fp8, _ = make_fp8_checkpoint(shape)
    with pytest.raises(CheckpointError, match=rf"tensor '{tensor}' in model.safetensors is a part of \d+ rows of a "
                       "fused FP8 projection: each part must be a multiple of 128 rows"):  # fmt: skip
        _load(fp8)


@pytest.mark.parametrize("quantized_by", ["checkpoint", "model.quantization"])
def test_batch_invariant_mode_with_fp8_weights_is_refused_naming_both_keys(make_runtime, fp8_checkpoint, quantized_by):
    overrides = {"model__quantization": "fp8"} if quantized_by == "model.quantization" else {}
    path = fp8_checkpoint[0] if quantized_by == "checkpoint" else None
    named = "model.quantization=fp8" if path is None else "quantization_config of .*config.json"
    assert ops.TRITON_INTERPRET  # the mode runs (in the interpreter) on the CPU: this refusal is FP8's
    with pytest.raises(
        ConfigError, match=f"engine.batch_invariant=true is not supported with FP8 weights \\({named}\\)"
    ):
        make_runtime(path, triton_kernels=True, engine__batch_invariant=True, **overrides)
