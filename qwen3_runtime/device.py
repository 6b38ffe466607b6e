"""Where the engine runs: the device and dtype from the config, how much memory is free, and how many KV blocks fit."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import torch

from qwen3_runtime.config import ArchitectureConfig, ConfigError, EngineConfig
from qwen3_runtime.kv_cache import kv_bytes_per_block
from qwen3_runtime.ops import cdiv

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_GIB = 1024**3


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # "cuda:abc", "cuda:-1", "cudafoo"
        raise ConfigError(f"engine.device={name!r} is invalid: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"engine.device={name!r} is unavailable: this machine has no CUDA device (use auto or cpu)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"engine.device={name!r} is unavailable: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return device


def set_cpu_threads(threads: int | None) -> None:
    """engine.cpu_threads for torch's CPU work; None leaves torch's setting, which it takes from OMP_NUM_THREADS when
    set (at its start: in the server's spawned engine process too, which inherits the environment)."""
    if threads is not None:
        torch.set_num_threads(threads)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors: the GPU's free memory, or the host's available memory for the CPU
    (None where it cannot be read); what this process no longer uses counts (release_memory)."""
    release_memory(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return host_available_memory()


def release_memory(device: torch.device) -> None:
    """Free the tensors only reference cycles keep (a dropped Runtime's: its runner's graphs and stager call back
    into it, so it waits for the cyclic garbage collector) and, on a GPU, hand the caching allocator's free blocks
    back to the driver, whose free memory would not count them."""
    gc.collect()
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


def host_available_memory() -> int | None:
    """Linux's MemAvailable (free plus reclaimable cache), within a cgroup v2 limit (containers, CI);
    elsewhere free pages from sysconf; None when neither exists."""
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return min(kib * 1024, _cgroup_headroom() or kib * 1024)


def _cgroup_headroom() -> int | None:
    """memory.max minus memory.current of this process's cgroup (v2), or None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        base = f"/sys/fs/cgroup{path}".rstrip("/")
        with open(f"{base}/memory.max") as f_max, open(f"{base}/memory.current") as f_cur:
            limit, current = f_max.read().strip(), int(f_cur.read())
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return None if limit == "max" else max(int(limit) - current, 0)


@contextlib.contextmanager
def allocations_sized_by_config(device: torch.device) -> Iterator[None]:
    """The engine's buffers, graphs and KV cache are sized by the config: running out of memory while making them
    is a ConfigError naming the keys that size them, not a traceback."""
    try:
        yield
    except RuntimeError as e:  # torch.OutOfMemoryError on a GPU; the CPU allocator raises a plain RuntimeError
        if not (isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e)):
            raise
        raise ConfigError(
            f"out of memory on {device} while allocating the engine ({str(e).splitlines()[0]}): lower "
            "engine.max_num_seqs, engine.max_num_batched_tokens, engine.max_model_len, engine.num_kv_blocks or "
            "engine.gpu_memory_utilization"
        ) from e


def check_weights_fit(num_bytes: int, device: torch.device, dtype: torch.dtype) -> None:
    """A clear error instead of an out-of-memory kill when the weights alone exceed free memory."""
    free = available_memory(device)
    if free is not None and num_bytes > free:
        held = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        ours = f" ({held / _GIB:.1f} GiB more hold this process's tensors: close() a Runtime no longer used)"
        raise ConfigError(
            f"the model's weights need {num_bytes / _GIB:.1f} GiB in {str(dtype).removeprefix('torch.')} "
            f"(model.dtype) but {device} has {free / _GIB:.1f} GiB available{ours if held else ''}: use a smaller "
            "model, a 16-bit model.dtype, or a GPU"
        )


def num_kv_blocks(
    engine: EngineConfig, arch: ArchitectureConfig, device: torch.device, dtype: torch.dtype, reserved: int = 0
) -> int:
    """engine.num_kv_blocks (checked to fit), or enough for max_num_seqs full-length sequences, capped by
    gpu_memory_utilization of the free memory (the GPU's, or the host's on the CPU) less `reserved` bytes (what
    the worst step needs: memory_profile.py)."""
    needed = cdiv(engine.max_model_len, engine.block_size)
    free = available_memory(device)
    per_block = kv_bytes_per_block(arch, engine.block_size, dtype)
    if engine.num_kv_blocks is not None:
        if engine.num_kv_blocks < needed:
            raise ConfigError(
                f"engine.num_kv_blocks={engine.num_kv_blocks} is too small: one engine.max_model_len="
                f"{engine.max_model_len} sequence needs {needed} blocks of engine.block_size={engine.block_size}"
            )
        if free is not None and engine.num_kv_blocks * per_block > free - reserved:
            raise ConfigError(
                f"engine.num_kv_blocks={engine.num_kv_blocks} needs {engine.num_kv_blocks * per_block / _GIB:.2f} GiB "
                f"but {device} has {free / _GIB:.2f} GiB free"
                + (f", less {reserved / _GIB:.2f} GiB for the largest step" if reserved else "")
                + ": lower engine.num_kv_blocks, or leave it null to size the cache from the free memory"
            )
        return engine.num_kv_blocks
    blocks = engine.max_num_seqs * cdiv(engine.max_model_len, engine.block_size)
    if free is None:
        return blocks
    fit = max(0, int(free * engine.gpu_memory_utilization) - reserved) // per_block
    if fit < needed:
        raise ConfigError(
            f"the KV cache fits {fit} blocks in engine.gpu_memory_utilization={engine.gpu_memory_utilization} of "
            f"the {free / _GIB:.2f} GiB free on {device}, less {reserved / _GIB:.2f} GiB for the largest step, but "
            f"one engine.max_model_len={engine.max_model_len} sequence needs {needed}: lower "
            "engine.max_model_len, engine.max_num_batched_tokens or engine.max_num_seqs, or use a smaller model"
        )
    return min(blocks, fit)
