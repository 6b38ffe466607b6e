"""Building an engine: device, dtype, threads, the model, and the runner with a KV cache sized around its worst
step. Runtime serves over what this builds; kept apart so that serving reads without the building's order."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen3_runtime import ops
from qwen3_runtime.config import ArchitectureConfig, Config, ConfigError, EngineConfig
from qwen3_runtime.device import (
    allocations_sized_by_config,
    release_memory,
    resolve_device,
    resolve_dtype,
    set_cpu_threads,
    size_kv_cache,
)
from qwen3_runtime.kv_cache import allocate_kv_cache
from qwen3_runtime.loader import load_model
from qwen3_runtime.memory_profile import worst_step_bytes
from qwen3_runtime.models.hf_config import model_architecture, model_weight_format
from qwen3_runtime.models.qwen3 import Qwen3ForCausalLM
from qwen3_runtime.quantization import FP8_BLOCK
from qwen3_runtime.runner import ModelRunner


@dataclass
class Engine:
    """What build_engine made. Runtime takes its fields and keeps no Engine, so that close() frees them."""

    config: Config  # as given, with engine.max_model_len resolved
    arch: ArchitectureConfig
    device: torch.device
    dtype: torch.dtype
    model: Qwen3ForCausalLM
    runner: ModelRunner
    kv_cache: torch.Tensor
    num_blocks: int


def build_engine(config: Config) -> Engine:
    """Everything is checked that can be before the weights load, which may take minutes."""
    engine = config.engine
    device = resolve_device(engine.device)
    if engine.batch_invariant and not (device.type == "cuda" or ops.TRITON_INTERPRET):
        # (Triton's interpreter runs the mode for tests, but its dots are numpy's, which are not invariant.)
        raise ConfigError("engine.batch_invariant=true needs a CUDA device: its kernels are Triton's")
    dtype = resolve_dtype(config.model.dtype, device)
    set_cpu_threads(engine.cpu_threads)  # before the weights load or initialize on the CPU
    arch = model_architecture(config.model)
    weights = model_weight_format(config.model)
    if engine.batch_invariant and weights.quantization:
        raise ConfigError(
            f"engine.batch_invariant=true is not supported with FP8 weights ({weights.declared_by}): the "
            "batch-invariant kernels multiply 16-bit weights"
        )
    if weights.quantization and device.type == "cuda":
        _check_fp8_gate_up(arch)
    context = resolve_context(engine, arch)
    model = load_model(config.model, device, dtype)
    return _allocate(config, arch, context, model, device, dtype)


def _check_fp8_gate_up(arch: ArchitectureConfig) -> None:
    """The GPU's FP8 gate/up kernels (dense and experts) keep gate and up rows in blocks of their own, so their
    intermediate sizes must be whole 128-row blocks: a checkpoint's fused parts are checked as they load, a shape
    quantized as it loads (model.quantization) here, before minutes of loading."""
    sizes = {"moe_intermediate_size": getattr(arch, "moe_intermediate_size", None)}
    if getattr(arch, "num_sparse_layers", 0) < arch.num_hidden_layers:  # some layers keep the dense MLP
        sizes["intermediate_size"] = arch.intermediate_size
    for key, size in sizes.items():
        if size is not None and size % FP8_BLOCK:
            raise ConfigError(
                f"FP8 weights on CUDA need {key} to be a multiple of {FP8_BLOCK} (the FP8 gate/up kernels keep gate "
                f"and up rows in blocks of their own): it is {size}"
            )


def _allocate(
    config: Config,
    arch: ArchitectureConfig,
    context: int,
    model: Qwen3ForCausalLM,
    device: torch.device,
    dtype: torch.dtype,
) -> Engine:
    """The runner and the KV cache.

    The runner is built and the worst step profiled for `context` before the cache is sized; where the cache
    holds less (max_model_len null), the runner is built again for what it holds, before any graph is captured,
    so its buffers, block tables and attention splits match the limit. The profile still bounds the steps: a
    shorter max_model_len only cuts the same token budget into shorter prompts."""
    with allocations_sized_by_config(device):
        resolved = config.with_max_model_len(context)
        runner = _new_runner(model, resolved)
        # The worst step's memory is set aside before the KV cache takes its share of what is free.
        reserved = worst_step_bytes(runner, resolved, dtype) if device.type == "cuda" else 0
        size = size_kv_cache(config.engine, arch, device, dtype, reserved)
        if size.max_model_len < context:
            del runner  # freed by release_memory (its graphs and stager call back into it: a cycle)
            release_memory(device)
            resolved = config.with_max_model_len(size.max_model_len)
            runner = _new_runner(model, resolved)
        kv_cache = allocate_kv_cache(arch, size.num_blocks, config.engine.block_size, dtype, device)
        runner.attach_kv_cache(kv_cache)
    return Engine(resolved, arch, device, dtype, model, runner, kv_cache, size.num_blocks)


def _new_runner(model: Qwen3ForCausalLM, config: Config) -> ModelRunner:
    model.build_rope_table(config.engine.max_model_len)
    return ModelRunner(model, config)


def resolve_context(engine: EngineConfig, arch: ArchitectureConfig) -> int:
    """The max_model_len the engine is built for before its KV cache is sized: engine.max_model_len, which the model
    must serve, or the model's context."""
    if engine.max_model_len is None:
        return arch.max_context
    if engine.max_model_len > arch.max_context:
        limit = "max_position_embeddings" if arch.rope_scaling is None else "rope_scaling's context"
        raise ConfigError(
            f"engine.max_model_len={engine.max_model_len} is out of range: must be <= "
            f"{limit}={arch.max_context} of the model"
        )
    return engine.max_model_len
