import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# Without a GPU, run the Triton kernels in Triton's interpreter so CI tests them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def edge_rows(vocab: int, gen: torch.Generator, ties: int = 3, minus_inf_share: float = 0.5) -> list[torch.Tensor]:
    """The rows every sampling and logprobs test starts from, drawn from `gen` in this order: plain, ties everywhere
    (integers in [-ties, ties)), a share of -inf, zeros of both signs, huge but finite."""
    return [
        torch.randn(vocab, generator=gen) * 3,
        torch.randint(-ties, ties, (vocab,), generator=gen).float(),
        torch.randn(vocab, generator=gen).masked_fill(
            torch.rand(vocab, generator=gen) < minus_inf_share, float("-inf")
        ),
        torch.where(torch.rand(vocab, generator=gen) < 0.5, -0.0, 0.0),
        (torch.rand(vocab, generator=gen) * 2 - 1) * 3e38,
    ]


def _write_checkpoint(
    path: Path,
    *,
    tie_word_embeddings: bool = True,
    num_key_value_heads: int = 2,
    num_attention_heads: int = 4,
    head_dim: int = 24,
    hidden_size: int = 64,
    intermediate_size: int | None = None,
    num_hidden_layers: int = 2,
    vocab_size: int = 512,
    seed: int = 0,
    max_shard_size: str | None = None,
    dtype: torch.dtype = torch.float32,
    rope_parameters: dict | None = None,
    moe: dict | None = None,
) -> Path:
    """A random Qwen3 checkpoint written by transformers itself, the parity reference; with `moe` (Qwen3MoeConfig's
    own keys), a Qwen3-MoE one.

    head_dim 24 with 4 heads (96) differs from hidden_size 64, as in the real models."""
    import transformers

    torch.manual_seed(seed)
    config_cls, model_cls = (
        (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)
        if moe is None
        else (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM)
    )
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size + 8,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        initializer_range=0.05,
        **({"rope_parameters": rope_parameters} if rope_parameters else {}),
        **(moe or {}),
    )
    model = model_cls(config).to(dtype)
    with torch.no_grad():  # norms other than the identity, as in trained checkpoints
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.3 * torch.randn_like(param))
    model.save_pretrained(path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return path


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory) -> Callable[..., Path]:
    """make_checkpoint(**shape) -> a fresh checkpoint directory."""
    return lambda **kw: _write_checkpoint(tmp_path_factory.mktemp("ckpt"), **kw)


@pytest.fixture(scope="session")
def tiny_checkpoint(make_checkpoint) -> Path:
    return make_checkpoint()


# A tiny Qwen3-MoE: layers 0 and 2 sparse (8 experts, top 3), layer 1 the dense MLP; untied, as the released ones.
TINY_MOE = dict(
    num_hidden_layers=3,
    tie_word_embeddings=False,
    moe=dict(
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=40,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    ),
)


@pytest.fixture(scope="session")
def tiny_moe_checkpoint(make_checkpoint) -> Path:
    return make_checkpoint(**TINY_MOE)


@pytest.fixture(scope="session")
def make_fp8_checkpoint(make_checkpoint, tmp_path_factory) -> Callable[..., tuple[Path, Path]]:
    """make_fp8_checkpoint(shape, scale_dtype, keep=(), dtype=torch.float32) -> (an FP8 checkpoint with its scales in
    scale_dtype and modules_to_not_convert `keep`, its dequantized twin), from a fresh checkpoint of `shape` in `dtype`
    (tests/fp8_checkpoints.py)."""
    from tests.fp8_checkpoints import write_fp8

    def make(shape: dict, scale_dtype: torch.dtype = torch.bfloat16, keep=(), dtype=torch.float32):
        root = tmp_path_factory.mktemp("fp8")
        write_fp8(make_checkpoint(dtype=dtype, **shape), root / "fp8", root / "twin", scale_dtype, list(keep))
        return root / "fp8", root / "twin"

    return make


@pytest.fixture(scope="session")
def fp8_checkpoint(make_fp8_checkpoint) -> tuple[Path, Path]:
    """A tiny dense FP8 checkpoint (scales in bf16) and its dequantized twin."""
    from tests.fp8_checkpoints import FP8_DENSE

    return make_fp8_checkpoint(FP8_DENSE)


@pytest.fixture(scope="session")
def fp8_moe_checkpoint(make_fp8_checkpoint) -> tuple[Path, Path]:
    """A tiny Qwen3-MoE FP8 checkpoint (scales in bf16; a sparse, a dense and a sparse layer) and its twin."""
    from tests.fp8_checkpoints import FP8_MOE

    return make_fp8_checkpoint(FP8_MOE)


@pytest.fixture(params=["tiny_checkpoint", "tiny_moe_checkpoint"], ids=["dense", "moe"])
def each_family_checkpoint(request) -> Path:
    """The tiny checkpoint of each family, for the engine tests that should hold for every model."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def copy_checkpoint(tmp_path_factory) -> Callable[..., Path]:
    """copy_checkpoint(checkpoint, **config_edits) -> a copy whose config.json has the edits (None deletes a key)."""

    def copy(checkpoint: Path, **config_edits) -> Path:
        path = tmp_path_factory.mktemp("edited") / "ckpt"
        shutil.copytree(checkpoint, path)
        config = json.loads((path / "config.json").read_text())
        config.update(config_edits)
        (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
        return path

    return copy


@pytest.fixture
def make_runtime(monkeypatch) -> Callable:
    """make_runtime(checkpoint, triton_kernels=False, **overrides) -> a CPU fp32 Runtime on configs/tiny.yaml.

    Overrides are dotted keys with "__" for ".". Engine tests run the kernels' PyTorch references
    (the interpreter is slow); kernel tests and the end-to-end parity test run the Triton kernels."""
    from qwen3_runtime import Runtime, ops

    def make(path: Path | None = None, triton_kernels: bool = False, **overrides):
        if not triton_kernels:
            monkeypatch.setattr(ops, "TRITON_INTERPRET", False)
        base = {"model.dtype": "float32", "engine.device": "cpu"}
        if path is not None:
            base["model.path"] = str(path)
        base.update({k.replace("__", "."): v for k, v in overrides.items()})
        return Runtime.from_yaml("tiny", overrides=base)

    return make
