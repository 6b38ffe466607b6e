"""The CLI in-process: a user's mistake is `error: ...` on stderr with exit 2, never a traceback."""

import json
import runpy
import shutil

import pytest
import torch

from qwen3_runtime import cli, ops
from qwen3_runtime.request import RequestMetrics, RequestOutput


@pytest.fixture(autouse=True)
def _reference_kernels(monkeypatch):
    """The kernels' PyTorch references: the Triton interpreter is slow (kernels have their own tests)."""
    monkeypatch.setattr(ops, "TRITON_INTERPRET", False)


def _run(capsys, *args):
    rc = cli.main(["generate", "--set", "engine.device=cpu", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _checkpoint(tiny_checkpoint, tmp_path, file=None, content=b""):
    """A copy of the tiny checkpoint with `file` replaced by `content` (bytes or text)."""
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, path)
    if file is not None:
        data = content.encode() if isinstance(content, str) else content
        (path / file).write_bytes(data)
    return path


def _config_json(tiny_checkpoint, **edits):
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    config.update(edits)
    return json.dumps({k: v for k, v in config.items() if v is not None})


def _tokenizer_without_template(tmp_path):
    """A tokenizer directory (the built-in tokenizer's tokenizer.json) whose config has no chat template."""
    from qwen3_runtime.tokenizer import Tokenizer

    path = tmp_path / "tokenizer"
    path.mkdir()
    Tokenizer.builtin_qwen3().hf_tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text("{}")
    return path


@pytest.mark.parametrize(
    "case, words",
    [
        ("no_path", ["model.path=", "nowhere", "not a directory"]),
        ("cuda", ["engine.device='cuda'", "no CUDA device"]),
        ("kv_blocks", ["engine.num_kv_blocks=1", "engine.max_model_len=256 sequence needs 16"]),
        ("max_model_len", ["engine.max_model_len=4096", "max_position_embeddings=256"]),
        ("yaml", ["bad.yaml", "not valid YAML", "at line 3"]),
        ("empty_safetensors", ["model.safetensors", "not a readable safetensors file"]),
        ("truncated_safetensors", ["model.safetensors", "not a readable safetensors file"]),
        ("config_json_syntax", ["config.json", "not readable JSON"]),
        ("config_json_missing_key", ["config.json", "missing config key vocab_size"]),
        ("config_json_wrong_type", ["config.json", "hidden_size='64'", "expected an integer"]),
        ("prompt_ids", ["--prompt-ids '1,,2'", "entry 1 is empty"]),
        ("set_yaml", ["--set", "not valid YAML"]),
        ("no_tokenizer", ["model.path=", "has no tokenizer.json", "set model.tokenizer", "builtin"]),
        ("no_chat_template", ["no chat template"]),
    ],
)
def test_user_errors_are_one_line_and_exit_2(case, words, capsys, monkeypatch, tmp_path, tiny_checkpoint):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def ckpt(file=None, content=b""):
        return ["--set", f"model.path={_checkpoint(tiny_checkpoint, tmp_path, file, content)}"]

    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("model:\n  path: [unclosed\n")
    weights = (tiny_checkpoint / "model.safetensors").read_bytes()
    args = {
        "no_path": lambda: ["--set", f"model.path={tmp_path / 'nowhere'}"],
        "cuda": lambda: ["--set", "engine.device=cuda"],
        "kv_blocks": lambda: ["--set", "engine.num_kv_blocks=1", "--set", "engine.max_model_len=256"],
        "max_model_len": lambda: ["--set", "engine.max_model_len=4096"],
        "yaml": lambda: ["--config", str(bad_yaml)],
        "empty_safetensors": lambda: ckpt("model.safetensors", b""),
        "truncated_safetensors": lambda: ckpt("model.safetensors", weights[: len(weights) // 2]),
        "config_json_syntax": lambda: ckpt("config.json", "{"),
        "config_json_missing_key": lambda: ckpt("config.json", _config_json(tiny_checkpoint, vocab_size=None)),
        "config_json_wrong_type": lambda: ckpt("config.json", _config_json(tiny_checkpoint, hidden_size="64")),
        "prompt_ids": lambda: ["--prompt-ids", "1,,2"],
        "set_yaml": lambda: ["--set", "generate.prompts=[[1,"],
        "no_tokenizer": lambda: [*ckpt(), "--prompt", "hi"],
        "no_chat_template": lambda: [
            "--set",
            f"model.tokenizer={_tokenizer_without_template(tmp_path)}",
            "--chat",
            "hi",
        ],
    }[case]()
    rc, out, err = _run(capsys, *args)
    assert rc == 2 and err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize(
    "edit, words",
    [
        ("missing_expert", ["missing tensor 'model.layers.2.mlp.experts.5.up_proj.weight'"]),
        ({"num_local_experts": 7}, ["unexpected tensor 'model.layers.0.mlp.experts.7.down_proj.weight'"]),
        (
            {"num_experts_per_tok": 9},
            ["config.json", "num_experts_per_tok=9 is out of range: must be <= num_experts=8"],
        ),
        ({"shared_expert_intermediate_size": 64}, ["shared_expert_intermediate_size is not honoured by the qwen3_moe"]),
    ],
    ids=["missing-expert", "expert-count", "experts-per-token", "shared-expert"],
)
def test_moe_checkpoint_errors_are_one_line_and_exit_2(edit, words, capsys, tmp_path, tiny_moe_checkpoint):
    from safetensors.torch import load_file, save_file

    if edit == "missing_expert":
        path = _checkpoint(tiny_moe_checkpoint, tmp_path)
        tensors = load_file(path / "model.safetensors")
        del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    else:
        path = _checkpoint(tiny_moe_checkpoint, tmp_path, "config.json", _config_json(tiny_moe_checkpoint, **edit))
    rc, out, err = _run(capsys, "--set", f"model.path={path}", "--set", "model.tokenizer=builtin")
    assert rc == 2 and err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize(
    "edit, words",
    [
        ({"quant_method": "awq"}, ["config.json: quantization_config.quant_method='awq' is invalid"]),
        ({"weight_block_size": [64, 64]}, ["quantization_config.weight_block_size=[64, 64] is not supported"]),
        (
            "bf16_weight",
            [
                "tensor 'model.layers.0.self_attn.o_proj.weight' in model.safetensors has dtype torch.bfloat16, "
                "expected torch.float8_e4m3fn"
            ],
        ),
        ("no_quantization_config", ["in model.safetensors has dtype torch.float8_e4m3fn, expected a 16- or 32-bit"]),
        ("batch_invariant", ["engine.batch_invariant=true is not supported with FP8 weights (quantization_config"]),
    ],
    ids=["quant-method", "block-size", "bf16-weight", "no-quantization-config", "batch-invariant"],
)
def test_fp8_checkpoint_errors_are_one_line_and_exit_2(edit, words, capsys, tmp_path, fp8_checkpoint, monkeypatch):
    from tests.fp8_checkpoints import edit_config, edit_tensors, quantization_config

    path = shutil.copytree(fp8_checkpoint[0], tmp_path / "fp8")
    args = ["--set", f"model.path={path}", "--set", "model.tokenizer=builtin"]
    name = "model.layers.0.self_attn.o_proj.weight"
    if edit == "bf16_weight":
        edit_tensors(path, lambda t: t.update({name: t[name].float().bfloat16()}))
    elif edit == "no_quantization_config":
        edit_config(path, quantization_config=None)
    elif edit == "batch_invariant":
        monkeypatch.setattr(ops, "TRITON_INTERPRET", True)  # the mode's own check passes on the CPU
        args += ["--set", "engine.batch_invariant=true"]
    else:
        edit_config(path, quantization_config=quantization_config([]) | edit)
    rc, out, err = _run(capsys, *args)
    assert rc == 2 and err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


def test_tiny_moe_generates_text(capsys):
    rc, out, err = _run(
        capsys, "--config", "tiny-moe", "--prompt", "What is 2+2?", "--set", "generate.sampling.max_tokens=3"
    )
    assert rc == 0, err
    lines = out.splitlines()
    assert (
        lines[0].startswith("model: random weights (seed 0), ")
        and "(4 layers, 3 sparse of 8 experts, 2 per token, hidden 64, " in lines[0]
    )
    assert lines[1].startswith("[0] prompt 7 tokens -> 3 tokens") and lines[2].startswith("    text: '")


def test_prints_model_line_prompt_and_output_logprobs(capsys):
    rc, out, err = _run(
        capsys,
        "--prompt-ids",
        "5, 6,7",
        "--set",
        "generate.sampling.prompt_logprobs=1",
        "--set",
        "generate.sampling.max_tokens=2",
    )
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("model: random weights (seed 0), ") and "(2 layers, hidden 64, " in lines[0]
    assert "vocab 151936), weights 37.47 MiB in float32; float32 on cpu with " in lines[0]
    assert lines[0].endswith(
        "max_model_len 256 (the model's context), max_num_seqs 8; KV cache 2048 tokens; CUDA graphs: none"
    )
    assert lines[1].startswith("[0] prompt 3 tokens -> 2 tokens")
    assert lines[2].startswith("    prompt 1: token 6 logprob ") and " top [" in lines[2]
    assert lines[3].startswith("    prompt 2: token 7 logprob ")
    assert lines[4].startswith("    0: token ") and lines[6].startswith("requests 1  output tokens 2")


def test_no_timing_line_when_every_request_failed(capsys):
    failed = RequestOutput(
        0, [1], [], None, None, "error", error="logits were not finite", metrics=RequestMetrics(0, 1, 2)
    )
    cli._print_timing([failed], wall=1.0)
    out, err = capsys.readouterr()
    assert out == "" and "no request succeeded" in err


def test_version_and_python_dash_m(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("qwen3-runtime ")
    monkeypatch.setattr("sys.argv", ["qwen3_runtime", "--version"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("qwen3_runtime", run_name="__main__")
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("qwen3-runtime ")


def test_a_text_that_is_not_utf8_fails_alone(capsys):
    """argv holds bytes that are not UTF-8 as unpaired surrogates: that prompt's error, the others' output."""
    rc, out, _ = _run(capsys, "--prompt", "a\udcffb", "--chat", "Hello", "--set", "generate.sampling.logprobs=null")
    assert rc == 1
    lines = out.splitlines()
    assert lines[1] == (
        "[0] error: prompt is not valid text: it holds an unpaired surrogate U+DCFF at index 1 (bytes that are not "
        "UTF-8?)"
    )
    assert lines[2].startswith("[1] prompt 9 tokens")


def test_text_and_chat_prompts_print_text(capsys):
    """The embedded default serves text: a prompt and a chat message go through Qwen3's tokenizer."""
    rc, out, _ = _run(capsys, "--prompt", "What is 2+2?", "--chat", "Hello", "--set", "generate.sampling.logprobs=null")
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].startswith("[0] prompt 7 tokens -> 8 tokens")  # "What is 2+2?" is 7 Qwen3 tokens
    assert lines[2].startswith("    text: '") and lines[4].startswith("    text: '")
    # The chat message through Qwen3's template: <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n
    assert lines[3].startswith("[1] prompt 9 tokens")


def test_prompts_keep_their_order_and_quiet_still_names_failures(capsys):
    rc, out, _ = _run(
        capsys, "--chat", "Hello", "--prompt-ids", "1,2", "--prompt", "Hi", "--set", "generate.sampling.max_tokens=1"
    )
    assert rc == 0
    assert [line.split(" tokens")[0] for line in out.splitlines() if line.startswith("[")] == [
        "[0] prompt 9",
        "[1] prompt 2",
        "[2] prompt 1",
    ]
    rc, out, err = _run(capsys, "--quiet", "--prompt-ids", "1,2", "--set", "generate.sampling.logprobs=50")
    assert rc == 1 and out.startswith("[0] error: logprobs=50 is out of range") and "no request succeeded" in err
