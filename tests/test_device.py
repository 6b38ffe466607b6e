import dataclasses

import pytest
import torch

from qwen3_runtime import device as dev
from qwen3_runtime.config import ConfigError, ModelConfig, load_config
from qwen3_runtime.kv_cache import kv_bytes_per_block
from qwen3_runtime.layers.build import LayerBuild
from qwen3_runtime.loader import _weight_bytes, load_model
from qwen3_runtime.models.registry import family_of

CPU = torch.device("cpu")
GIB = 1024**3


def test_host_memory_is_read():
    free = dev.host_available_memory()
    assert free is None or free > 0


def test_cpu_kv_cache_is_capped_by_available_memory_and_max_model_len_by_the_cache(monkeypatch):
    """Qwen3-0.6B's 256 sequences of its 40,960 tokens would take 2.4 TB; on the CPU the cap is the host's memory.
    max_model_len null takes what that cache holds where it is less than the model's context; an explicit one must
    fit, and null too once not even two tokens fit."""
    cfg = load_config("qwen3-0.6b")
    arch, engine = cfg.model.architecture, cfg.engine
    per_block = kv_bytes_per_block(arch, 16, torch.float32)
    explicit = dataclasses.replace(engine, max_model_len=4096)
    monkeypatch.setattr(dev, "host_available_memory", lambda: 2 * GIB)
    fit = int(2 * GIB * engine.gpu_memory_utilization) // per_block
    assert dev.size_kv_cache(engine, arch, CPU, torch.float32) == dev.KvCacheSize(fit, 16 * fit)
    assert dev.size_kv_cache(explicit, arch, CPU, torch.float32) == dev.KvCacheSize(fit, 4096)
    monkeypatch.setattr(dev, "host_available_memory", lambda: 64 * GIB)
    assert dev.size_kv_cache(engine, arch, CPU, torch.float32).max_model_len == 40960  # the model's context
    monkeypatch.setattr(dev, "host_available_memory", lambda: 64 * 1024**2)
    with pytest.raises(ConfigError, match=r"fits 16 blocks.*but one engine.max_model_len=4096 sequence needs 256"):
        dev.size_kv_cache(explicit, arch, CPU, torch.float32)
    assert dev.size_kv_cache(engine, arch, CPU, torch.float32) == dev.KvCacheSize(16, 256)
    monkeypatch.setattr(dev, "host_available_memory", lambda: per_block)
    with pytest.raises(
        ConfigError,
        match=r"^the KV cache fits 0 blocks of engine.block_size=16 \(in engine.gpu_memory_utilization=0.9 of the "
        r"0.00 GiB free on cpu, less 0.00 GiB for the largest step\): not even one request fits \(a prompt token and a "
        r"generated one\): raise engine.gpu_memory_utilization, lower engine.max_num_batched_tokens or "
        r"engine.max_num_seqs, or use a smaller model$",
    ):
        dev.size_kv_cache(engine, arch, CPU, torch.float32)


def test_too_few_kv_blocks_names_the_key_or_cap_max_model_len():
    cfg = load_config("tiny", {"engine.num_kv_blocks": 1})
    engine, arch = cfg.engine, cfg.model.architecture
    assert dev.size_kv_cache(engine, arch, CPU, torch.float32) == dev.KvCacheSize(1, 16)
    with pytest.raises(
        ConfigError,
        match=r"fits 1 blocks of engine.block_size=16 \(engine.num_kv_blocks=1\) but one engine.max_model_len=256 "
        r"sequence needs 16: lower engine.max_model_len \(null: the most the cache holds\), or raise "
        r"engine.num_kv_blocks$",
    ):
        dev.size_kv_cache(dataclasses.replace(engine, max_model_len=256), arch, CPU, torch.float32)


def test_explicit_kv_blocks_must_fit_the_free_memory(monkeypatch):
    monkeypatch.setattr(dev, "host_available_memory", lambda: GIB)
    cfg = load_config("tiny", {"engine.num_kv_blocks": 10**6})
    engine, arch = cfg.engine, cfg.model.architecture
    per_block = kv_bytes_per_block(arch, engine.block_size, torch.float32)
    with pytest.raises(
        ConfigError, match=r"^engine.num_kv_blocks=1000000 needs \d+\.\d\d GiB but cpu has 1.00 GiB free: "
    ):
        dev.size_kv_cache(engine, arch, CPU, torch.float32)
    fits = load_config("tiny", {"engine.num_kv_blocks": GIB // 2 // per_block}).engine
    assert dev.size_kv_cache(fits, arch, CPU, torch.float32) == dev.KvCacheSize(GIB // 2 // per_block, 256)
    with pytest.raises(ConfigError, match=r"free, less 0.75 GiB for the largest step: lower engine.num_kv_blocks"):
        dev.size_kv_cache(fits, arch, CPU, torch.float32, reserved=3 * GIB // 4)


def test_running_out_of_memory_while_sizing_the_engine_names_the_keys(monkeypatch, make_runtime, tiny_checkpoint):
    """A GPU's OutOfMemoryError and the CPU allocator's RuntimeError alike; any other error keeps its traceback."""
    from qwen3_runtime import engine_setup

    def kv_cache_raising(error: Exception):
        def allocate(*args):
            raise error

        return allocate

    for error in (
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99 bytes"),
    ):
        monkeypatch.setattr(engine_setup, "allocate_kv_cache", kv_cache_raising(error))
        with pytest.raises(
            ConfigError, match=r"^out of memory on cpu while allocating the engine \(.*\): lower engine"
        ):
            make_runtime(tiny_checkpoint)
    monkeypatch.setattr(engine_setup, "allocate_kv_cache", kv_cache_raising(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="^a bug$"):
        make_runtime(tiny_checkpoint)


def test_weights_larger_than_memory_are_an_error_before_allocating(monkeypatch):
    monkeypatch.setattr(dev, "host_available_memory", lambda: 8 * GIB)
    arch = load_config("qwen3-32b").model.architecture
    with pytest.raises(ConfigError, match=r"weights need 12\d\.\d GiB in float32 \(model.dtype\) but cpu has 8.0 GiB"):
        load_model(ModelConfig(architecture=arch), CPU, torch.float32)


def test_qwen3_235b_in_bf16_on_one_gpu_is_refused_naming_what_it_needs_and_what_fits(monkeypatch):
    """437.9 GiB of bfloat16 weights against an H200's 139 GiB: refused before anything is allocated."""
    monkeypatch.setattr(dev, "available_memory", lambda device: 139 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    monkeypatch.setattr(torch.nn.Module, "to_empty", lambda *a, **k: pytest.fail("allocated"))
    arch = load_config("qwen3-235b-a22b").model.architecture
    with pytest.raises(ConfigError) as err:
        load_model(ModelConfig(architecture=arch), torch.device("cuda"), torch.bfloat16)
    assert str(err.value) == (
        "the model's weights need 437.9 GiB in bfloat16 (model.dtype) but cuda has 139.0 GiB available, which holds "
        "about 74.6B parameters in bfloat16: use a smaller model, FP8 weights (model.quantization: fp8, about 218.9 "
        "GiB) or a GPU with more memory (splitting a model over several GPUs is not supported yet)"
    )


def test_qwen3_30b_a3b_fits_one_80_gb_gpu_in_bf16(monkeypatch):
    monkeypatch.setattr(dev, "available_memory", lambda device: 79 * GIB)
    arch = load_config("qwen3-30b-a3b").model.architecture
    nbytes = _weight_bytes(family_of(arch).model_cls(), arch, LayerBuild(torch.bfloat16))
    assert round(nbytes / GIB, 1) == 56.9
    dev.check_weights_fit(nbytes, torch.device("cuda"), torch.bfloat16)


def test_a_shape_far_too_large_is_refused_before_its_layers_are_built():
    arch = dataclasses.replace(load_config("tiny").model.architecture, num_hidden_layers=2**62)
    with pytest.raises(ConfigError, match=r"^the model's weights need \d+\.\d GiB in float32 \(model.dtype\)"):
        load_model(ModelConfig(architecture=arch), CPU, torch.float32)


def test_missing_cuda_device_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"engine.device='cuda' is unavailable"):
        dev.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"engine.device='cuda:1' is unavailable: this machine has 1 CUDA device"):
        dev.resolve_device("cuda:1")
    for name in ("cuda:abc", "cuda:-1", "cudafoo"):  # past the config's prefix check, refused by torch
        with pytest.raises(ConfigError, match=rf"engine.device='{name}' is invalid: use auto, cpu, cuda or cuda:N"):
            dev.resolve_device(name)


def test_engine_cpu_threads_reach_torch_and_null_leaves_torchs_own(make_runtime, tiny_checkpoint):
    threads = torch.get_num_threads()
    try:
        make_runtime(tiny_checkpoint, engine__cpu_threads=1)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(3)  # as OMP_NUM_THREADS=3 would have set it at torch's start
        make_runtime(tiny_checkpoint)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)


def test_float32_on_cuda_is_refused_naming_the_key():
    """The GPU kernels take 16-bit weights; float32 is for the CPU."""
    with pytest.raises(ConfigError, match="model.dtype=float32 is not supported on CUDA"):
        dev.resolve_dtype("float32", torch.device("cuda"))
    assert dev.resolve_dtype("float32", CPU) is torch.float32
    assert dev.resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
