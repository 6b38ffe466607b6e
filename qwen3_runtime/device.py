"""Where the engine runs: the device and dtype from the config, and how many KV blocks fit."""

from __future__ import annotations

import torch

from qwen3_runtime.config import ArchitectureConfig, EngineConfig
from qwen3_runtime.kv_cache import kv_bytes_per_block
from qwen3_runtime.ops import cdiv

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"engine.device={name!r} is unavailable: this machine has no CUDA device")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def num_kv_blocks(engine: EngineConfig, arch: ArchitectureConfig, device: torch.device, dtype: torch.dtype) -> int:
    """engine.num_kv_blocks, or enough for max_num_seqs full-length sequences, capped by free memory."""
    if engine.num_kv_blocks is not None:
        blocks = engine.num_kv_blocks
    else:
        blocks = engine.max_num_seqs * cdiv(engine.max_model_len, engine.block_size)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            per_block = kv_bytes_per_block(arch, engine.block_size, dtype)
            blocks = min(blocks, int(free * engine.gpu_memory_utilization) // per_block)
    needed = cdiv(engine.max_model_len, engine.block_size)
    if blocks < needed:
        raise ValueError(
            f"engine.num_kv_blocks={blocks} is too small: one max_model_len sequence "
            f"needs {needed} blocks of engine.block_size={engine.block_size}"
        )
    return blocks
