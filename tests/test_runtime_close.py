"""Several Runtimes one after another in one process (a notebook, a benchmark comparing configs): close() and a
`with` block give the memory back at once, and a Runtime merely dropped gives it back before the next one sizes
its cache."""

import gc
import weakref

import pytest
import torch

from qwen3_runtime import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture
def no_automatic_gc():
    """Only explicit collections: what a reference cycle keeps stays until one."""
    gc.disable()
    yield
    gc.enable()


def test_close_releases_the_weights_and_the_cache_and_the_next_runtime_serves_alike(
    make_runtime, tiny_checkpoint, no_automatic_gc
):
    with make_runtime(tiny_checkpoint) as rt:
        first = rt.generate([[5, 6, 7]], GREEDY)[0].token_ids
        held = [weakref.ref(t) for t in (rt.model.lm_head.weight, rt.kv_cache, rt.runner.logits)]
    assert all(ref() is None for ref in held)
    with pytest.raises(RuntimeError, match="closed"):
        rt.generate([[5, 6, 7]], GREEDY)
    rt.close()  # again: nothing to do
    second = make_runtime(tiny_checkpoint)
    assert second.generate([[5, 6, 7]], GREEDY)[0].token_ids == first


def test_a_dropped_runtime_is_freed_before_the_next_one_reads_the_free_memory(
    make_runtime, tiny_checkpoint, no_automatic_gc
):
    """Its runner sits in reference cycles (the graphs and the stager call back into it), which only the cyclic
    collector frees: the next Runtime runs it before it reads how much memory is free."""
    rt = make_runtime(tiny_checkpoint)
    rt.generate([[5, 6, 7]], GREEDY)
    cache = weakref.ref(rt.kv_cache)
    del rt
    assert cache() is not None  # kept by the cycles
    make_runtime(tiny_checkpoint)
    assert cache() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_closed_or_dropped_runtime_gives_the_next_one_all_its_gpu_memory():
    """Each Runtime's KV cache takes 0.9 of the free memory, so the next would get a fraction of it (or no room for
    its weights) if the last one's cache, graphs or weights were still held, or cached by the allocator."""
    from qwen3_runtime import Runtime

    overrides = {"engine.max_model_len": 1024, "engine.max_num_seqs": 16, "engine.cuda_graph_buckets": [1, 8]}
    prompts = [[5, 6, 7], list(range(100, 400))]
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    with Runtime.from_yaml("qwen3-0.6b", overrides) as rt:
        blocks = rt.scheduler.blocks.num_blocks
        expected = [out.token_ids for out in rt.generate(prompts, GREEDY)]
    # What stays is torch's per-stream cuBLAS workspaces, not the engine.
    assert torch.cuda.memory_allocated() - before < 256 * 1024**2
    again = Runtime.from_yaml("qwen3-0.6b", overrides)
    assert again.scheduler.blocks.num_blocks >= 0.95 * blocks
    assert [out.token_ids for out in again.generate(prompts, GREEDY)] == expected
    del again  # no close(): the next Runtime collects it before reading the free memory
    last = Runtime.from_yaml("qwen3-0.6b", overrides)
    assert last.scheduler.blocks.num_blocks >= 0.95 * blocks
    last.close()
