"""FP8 checkpoints in Qwen's format (tests/fp8_checkpoints.py), dense and MoE, against transformers over their
dequantized twins (fp32, CPU): the logits, the Runtime's greedy tokens, logprobs and prompt logprobs;
modules_to_not_convert; a 16-bit checkpoint or random weights quantized as they load (model.quantization: fp8)."""

import math

import pytest
import torch

from qwen3_runtime import SamplingParams, ops
from qwen3_runtime.config import ModelConfig
from qwen3_runtime.layers.experts import UnquantizedExperts
from qwen3_runtime.layers.fp8 import Fp8Experts, Fp8Weight
from qwen3_runtime.layers.linear import UnquantizedWeight
from qwen3_runtime.loader import load_model
from tests.fp8_checkpoints import FP8_DENSE, FP8_MOE, write_fp8
from tests.models.test_qwen3 import assert_prefill_and_decode_match

FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _reference_kernels(monkeypatch):
    """The kernels' PyTorch references: the FP8 path on the CPU (the interpreter is slow; kernels have their tests)."""
    monkeypatch.setattr(ops, "TRITON_INTERPRET", False)


def _load(path, **model_keys):
    model = load_model(ModelConfig(path=str(path), **model_keys), torch.device("cpu"), torch.float32)
    model.build_rope_table(256)
    return model


def _transformers(twin):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()


def _formats(model) -> dict[str, str]:
    """Each projection's (or layer's experts') weight class, by module name."""
    kinds = (Fp8Weight, Fp8Experts, UnquantizedWeight, UnquantizedExperts)
    return {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, kinds)}


@pytest.mark.parametrize("shape", [FP8_DENSE, FP8_MOE], ids=["dense", "moe"])
@pytest.mark.parametrize(
    "scale_dtype, dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32), (torch.float32, torch.float32)],
    ids=["bf16-scales-bf16-model", "fp16-scales", "fp32-scales"],
)
def test_fp8_checkpoint_matches_transformers_over_its_dequantized_weights(
    make_fp8_checkpoint, shape, scale_dtype, dtype
):
    """Every projection e4m3 with fp32 scales (whatever the checkpoint's scale dtype), the rest in the model's dtype;
    prefill and decode logits within fp32 rounding of transformers' over the same weights dequantized."""
    fp8, twin = make_fp8_checkpoint(shape, scale_dtype, dtype=dtype)
    ours = _load(fp8)
    for name, p in ours.named_parameters():
        quantized = name.endswith(("_proj.weight", "w13_weight", "w2_weight"))
        assert p.dtype == (FP8 if quantized else torch.float32), name
    attn = ours.model.layers[0].self_attn
    assert attn.qkv_proj.weight_scale_inv.shape == (4, 2) and attn.o_proj.weight_scale_inv.shape == (2, 2)
    if "moe" in shape:
        experts = ours.model.layers[2].mlp.experts
        assert experts.w13_weight_scale_inv.shape == (4, 2, 2) and experts.w2_weight_scale_inv.shape == (4, 2, 1)
    assert_prefill_and_decode_match(ours, _transformers(twin))


def _teacher_forced(model, tokens: list[int]) -> torch.Tensor:
    """log-probabilities [len(tokens), vocab] in float64 (row i: of the token after tokens[i])."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double().log_softmax(-1)


@pytest.mark.parametrize("checkpoint", ["fp8_checkpoint", "fp8_moe_checkpoint"], ids=["dense", "moe"])
def test_runtime_greedy_tokens_logprobs_and_prompt_logprobs(make_runtime, request, checkpoint):
    """Greedy tokens are the reference's best, their logprobs and the prompt's its own, on the device path as the
    host path's float64 scan gives them (the logprobs reduction is the 16-bit model's, unchanged)."""
    fp8, twin = request.getfixturevalue(checkpoint)
    prompt = [(7 * i) % 500 + 1 for i in range(30)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=3)
    out = make_runtime(fp8, engine__max_num_batched_tokens=64).generate([prompt], params)[0]
    host = make_runtime(fp8, logprobs__path="host").generate([prompt], params)[0]
    ref = _teacher_forced(_transformers(twin), prompt + out.token_ids)
    assert out.error is None and out.token_ids == host.token_ids
    assert out.token_ids == ref[len(prompt) - 1 : -1].argmax(-1).tolist()
    for i, (lp, lp_host) in enumerate(zip(out.logprobs, host.logprobs)):
        want = ref[len(prompt) - 1 + i]
        assert math.isclose(lp.logprob, want[lp.token_id].item(), abs_tol=1e-4)
        assert lp.top_ids == lp_host.top_ids == want.topk(3).indices.tolist()
        assert math.isclose(lp.logprob, lp_host.logprob, abs_tol=1e-4)
    assert out.prompt_logprobs[0] is None
    for i, lp in enumerate(out.prompt_logprobs[1:]):
        assert lp.token_id == prompt[i + 1]
        assert math.isclose(lp.logprob, ref[i, prompt[i + 1]].item(), abs_tol=1e-4)
        assert lp.top_ids == ref[i].topk(3).indices.tolist()


def test_modules_to_not_convert_stay_16_bit(make_fp8_checkpoint):
    """Entries match whole name segments: a layer's self_attn, its experts, a down_proj; `mlp.gate` (a router's name,
    as Qwen's MoE checkpoints list it) leaves the dense layer's gate_proj in FP8. A gate/up in FP8 with a 16-bit
    down_proj runs the two products in turn."""
    keep = [
        "model.layers.1.self_attn",
        "model.layers.1.mlp.down_proj",
        "layers.2.mlp.experts",
        "model.layers.1.mlp.gate",
    ]
    fp8, twin = make_fp8_checkpoint(FP8_MOE, keep=keep)
    ours = _load(fp8)
    formats = {name.removeprefix("model.layers."): kind for name, kind in _formats(ours).items()}
    assert formats == {
        "0.self_attn.qkv_proj": "Fp8Weight",
        "0.self_attn.o_proj": "Fp8Weight",
        "0.mlp.experts": "Fp8Experts",
        "1.self_attn.qkv_proj": "UnquantizedWeight",
        "1.self_attn.o_proj": "UnquantizedWeight",
        "1.mlp.gate_up_proj": "Fp8Weight",
        "1.mlp.down_proj": "UnquantizedWeight",
        "2.self_attn.qkv_proj": "Fp8Weight",
        "2.self_attn.o_proj": "Fp8Weight",
        "2.mlp.experts": "UnquantizedExperts",
    }
    assert_prefill_and_decode_match(ours, _transformers(twin))


def test_a_16_bit_checkpoint_with_model_quantization_fp8_is_quantized_as_it_loads(make_checkpoint, tmp_path):
    """The same blocks and scales as the FP8 checkpoint written from it (fp32 scales: nothing rounded)."""
    source = make_checkpoint(**FP8_MOE)
    write_fp8(source, tmp_path / "fp8", tmp_path / "twin", torch.float32, [])
    quantized, stored = _load(source, quantization="fp8"), _load(tmp_path / "fp8")
    for (name, a), b in zip(quantized.named_parameters(), stored.parameters()):
        assert a.dtype == b.dtype and torch.equal(a.float(), b.float()), name


def test_random_weights_with_model_quantization_fp8():
    """A random shape in FP8, drawn as in 16 bits then quantized whole (tiny-moe's fused parts are no whole blocks):
    seeded, served, and summarised with its format and bytes, scales included."""
    from qwen3_runtime import Runtime

    overrides = {"model.dtype": "float32", "engine.device": "cpu", "model.quantization": "fp8"}
    runs = [Runtime.from_yaml("tiny-moe", overrides=overrides) for _ in range(2)]
    for (name, a), b in zip(runs[0].model.named_parameters(), runs[1].model.parameters()):
        assert torch.equal(a.float(), b.float()), name
    experts = runs[0].model.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == FP8 and experts.w13_weight_scale_inv.shape == (8, 1, 1)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    outs = [rt.generate([[1, 2, 3]], params)[0] for rt in runs]
    assert outs[0].error is None and outs[0].token_ids == outs[1].token_ids
    held = sum(p.nbytes for p in runs[0].model.parameters())
    summary = runs[0].summary
    assert summary.fp8 and summary.weight_bytes == held
    assert f", weights {held / 2**20:.2f} MiB in FP8 (128x128 blocks) and float32; float32 on cpu" in str(summary)
    for rt in runs:
        rt.close()


@pytest.mark.parametrize(
    ("config", "key", "size"), [("tiny-moe", "moe_intermediate_size", 32), ("tiny", "intermediate_size", 200)]
)
def test_fp8_on_cuda_refuses_gate_up_sizes_that_are_not_whole_blocks(monkeypatch, config, key, size):
    """On the CPU a small random shape runs in FP8 (the references dequantize); the GPU's FP8 gate/up kernels need
    whole 128-row blocks: refused by key before anything loads."""
    from qwen3_runtime import engine_setup
    from qwen3_runtime.config import ConfigError, load_config

    monkeypatch.setattr(engine_setup, "resolve_device", lambda name: torch.device("cuda"))
    overrides = {"model.quantization": "fp8", "model.dtype": "bfloat16", f"model.architecture.{key}": size}
    with pytest.raises(ConfigError, match=f"FP8 weights on CUDA need {key} to be a multiple of 128.*it is {size}"):
        engine_setup.build_engine(load_config(config, overrides))
