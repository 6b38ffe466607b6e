"""Hugging Face transformers as the yardstick: the same Qwen3 shape as one of our configs, random
weights, and its static-cache `generate` (auto-compiled by transformers) timed token by token."""

from __future__ import annotations

import statistics
import time

import torch

from qwen3_runtime.config import ArchitectureConfig


def hf_config(arch: ArchitectureConfig, layers: int | None = None):
    """transformers' config of `arch`: Qwen3MoeConfig for a MoE shape (sparse layers as ours: decoder_sparse_step,
    mlp_only_layers), else Qwen3Config."""
    import transformers

    common = dict(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=layers or arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        rms_norm_eps=arch.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
    )
    if not hasattr(arch, "num_experts"):
        return transformers.Qwen3Config(**common)
    return transformers.Qwen3MoeConfig(
        **common,
        num_experts=arch.num_experts,
        num_experts_per_tok=arch.num_experts_per_tok,
        moe_intermediate_size=arch.moe_intermediate_size,
        norm_topk_prob=arch.norm_topk_prob,
        decoder_sparse_step=arch.decoder_sparse_step,
        mlp_only_layers=[i for i in arch.mlp_only_layers if i < common["num_hidden_layers"]],
    )


def random_hf_model(
    arch: ArchitectureConfig,
    layers: int | None = None,
    seed: int = 0,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
):
    """Built in `dtype` (not fp32 then cast: Qwen3-30B-A3B in fp32 would not fit an 80 GB GPU)."""
    import transformers

    config = hf_config(arch, layers)
    cls = transformers.Qwen3MoeForCausalLM if hasattr(arch, "num_experts") else transformers.Qwen3ForCausalLM
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config).eval()
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = None  # every run generates exactly max_new_tokens
    return model


class _TokenClock:
    """A streamer that notes when each step's tokens reach the host (generate syncs every step)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def static_cache_tpot(model, batch: int, prompt_len: int, max_tokens: int, seed: int = 0) -> dict:
    """Greedy `generate` with cache_implementation="static" (transformers compiles the decode forward
    itself), timed as bench_decode times ours: TPOT = (last token - first token) / (tokens - 1) and ITL =
    the median gap between consecutive tokens, in ms. The prompt put and the prefill are left out."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device="cuda", generator=gen)
    clock = _TokenClock()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            cache_implementation="static",
            pad_token_id=0,
            streamer=clock,
        )
    tokens = clock.times[1:]  # times[0]: the prompt
    gaps = [b - a for a, b in zip(tokens[1:], tokens[2:])]
    return {"tpot_ms": 1e3 * (tokens[-1] - tokens[0]) / (len(tokens) - 1), "itl_ms": 1e3 * statistics.median(gaps)}
