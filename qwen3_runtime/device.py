"""Where the engine runs: the device and dtype from the config, how much memory is free, how many KV blocks fit and
the max_model_len they hold."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass

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
    if name == "float32" and device.type == "cuda":  # their pipelines would outgrow an SM's shared memory
        raise ConfigError("model.dtype=float32 is not supported on CUDA: the GPU kernels take 16-bit weights (use "
                          "bfloat16 or float16; float32 runs on the CPU)")  # fmt: skip
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


def check_weights_fit(num_bytes: int, device: torch.device, dtype: torch.dtype, fp8: bool = False) -> None:
    """A clear error instead of an out-of-memory kill when the weights alone exceed free memory: what they need, what
    is available, what would fit and what can be done today. fp8: the projections are FP8 already."""
    free = available_memory(device)
    if free is None or num_bytes <= free:
        return
    held = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    ours = f" ({held / _GIB:.1f} GiB more hold this process's tensors: close() a Runtime no longer used)"
    name = str(dtype).removeprefix("torch.")
    remedies = ["a smaller model"]
    if dtype.itemsize > 2 and not fp8:
        remedies.append(f"a 16-bit model.dtype ({num_bytes / dtype.itemsize * 2 / _GIB:.1f} GiB)")
    if not fp8:
        remedies.append(f"FP8 weights (model.quantization: fp8, about {num_bytes / dtype.itemsize / _GIB:.1f} GiB)")
    remedies.append("a GPU" if device.type == "cpu" else "a GPU with more memory")
    kind = f"FP8 and {name}" if fp8 else name
    raise ConfigError(
        f"the model's weights need {num_bytes / _GIB:.1f} GiB in {kind} (model.dtype) but {device} has "
        f"{free / _GIB:.1f} GiB available{ours if held else ''}, which holds about {free / dtype.itemsize / 1e9:.1f}B "
        f"parameters in {name}: use {', '.join(remedies[:-1])} or {remedies[-1]} (splitting a model over several "
        "GPUs is not supported yet)"
    )


@dataclass(frozen=True)
class KvCacheSize:
    num_blocks: int
    max_model_len: int  # engine.max_model_len, or what null resolved to


def size_kv_cache(
    engine: EngineConfig, arch: ArchitectureConfig, device: torch.device, dtype: torch.dtype, reserved: int = 0
) -> KvCacheSize:
    """The KV cache's blocks: engine.num_kv_blocks (checked to fit), or enough for max_num_seqs full-length sequences,
    capped by gpu_memory_utilization of the free memory (the GPU's, or the host's on the CPU) less `reserved` bytes
    (what the worst step needs: memory_profile.py). And max_model_len: the engine's, which one sequence must fit in
    the cache, or where it is null the model's context (arch.max_context) capped by what the cache holds, as vLLM's
    automatic max_model_len: an error only when not even one request fits."""
    free = available_memory(device)
    per_block = kv_bytes_per_block(arch, engine.block_size, dtype)
    if engine.num_kv_blocks is not None:
        if free is not None and engine.num_kv_blocks * per_block > free - reserved:
            raise ConfigError(
                f"engine.num_kv_blocks={engine.num_kv_blocks} needs {engine.num_kv_blocks * per_block / _GIB:.2f} GiB "
                f"but {device} has {free / _GIB:.2f} GiB free"
                + (f", less {reserved / _GIB:.2f} GiB for the largest step" if reserved else "")
                + ": lower engine.num_kv_blocks, or leave it null to size the cache from the free memory"
            )
        capacity = engine.num_kv_blocks
        source, remedy = f"engine.num_kv_blocks={capacity}", "raise engine.num_kv_blocks"
    elif free is None:  # no bound known: max_num_seqs sequences of the context
        max_model_len = engine.max_model_len or arch.max_context
        return KvCacheSize(engine.max_num_seqs * cdiv(max_model_len, engine.block_size), max_model_len)
    else:
        capacity = max(0, int(free * engine.gpu_memory_utilization) - reserved) // per_block
        source = (
            f"in engine.gpu_memory_utilization={engine.gpu_memory_utilization} of the {free / _GIB:.2f} GiB free on "
            f"{device}, less {reserved / _GIB:.2f} GiB for the largest step"
        )
        remedy = (
            "raise engine.gpu_memory_utilization, lower engine.max_num_batched_tokens or engine.max_num_seqs, or use "
            "a smaller model"
        )
    max_model_len = _max_model_len(engine, arch, capacity, source, remedy)
    wanted = engine.max_num_seqs * cdiv(max_model_len, engine.block_size)
    return KvCacheSize(engine.num_kv_blocks or min(wanted, capacity), max_model_len)


def _max_model_len(engine: EngineConfig, arch: ArchitectureConfig, capacity: int, source: str, remedy: str) -> int:
    """engine.max_model_len, checked to fit the cache's `capacity` blocks, or the model's context capped by them;
    `source` says where the capacity comes from, `remedy` which keys raise it."""
    if engine.max_model_len is None:
        if capacity * engine.block_size < 2:
            raise ConfigError(
                f"the KV cache fits {capacity} blocks of engine.block_size={engine.block_size} ({source}): not even "
                f"one request fits (a prompt token and a generated one): {remedy}"
            )
        return min(arch.max_context, capacity * engine.block_size)
    needed = cdiv(engine.max_model_len, engine.block_size)
    if capacity < needed:
        raise ConfigError(
            f"the KV cache fits {capacity} blocks of engine.block_size={engine.block_size} ({source}) but one "
            f"engine.max_model_len={engine.max_model_len} sequence needs {needed}: lower engine.max_model_len (null: "
            f"the most the cache holds), or {remedy}"
        )
    return engine.max_model_len
