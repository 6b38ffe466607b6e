"""The worst step's memory, set aside before the KV cache is sized: the profile's steps run and leave the runner
as they found it; on the GPU, the worst allowed shapes run once the cache has taken its share."""

import gc

import pytest
import torch

from qwen3_runtime import Runtime, SamplingParams
from qwen3_runtime.memory_profile import worst_step_bytes

# Top-p alone asking processed logprobs: the variant that sorts.
WORST = dict(
    temperature=0.7, top_p=0.8, repetition_penalty=1.1, logprobs=20, logprobs_mode="processed", ignore_eos=True
)


@pytest.mark.parametrize("path", ["device", "host"])
def test_the_profile_steps_run_and_leave_the_runner_as_it_was(make_runtime, tiny_checkpoint, path):
    rt = make_runtime(tiny_checkpoint, logprobs__path=path)
    cache = rt.runner.kv_cache
    expected = rt.generate([[5, 6, 7]], SamplingParams(max_tokens=6, **WORST, seed=1))[0].token_ids

    assert worst_step_bytes(rt.runner, rt.config, rt.dtype) == 0  # measured on GPUs only

    assert rt.runner.kv_cache is cache and rt.runner.stats.prefill_steps == rt.runner.stats.decode_steps == 0
    assert rt.runner.tail.penalties.held == {} and len(rt.runner.tail.penalties.free) == rt.config.engine.max_num_seqs
    assert rt.generate([[5, 6, 7]], SamplingParams(max_tokens=6, **WORST, seed=1))[0].token_ids == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_worst_allowed_shapes_fit_after_the_kv_cache_took_its_share():
    """A KV cache capped by memory (the default 256 sequences of 32k tokens would need ~960 GB), with the decode
    graphs captured for 256 rows after it, then every row asking processed logprobs 20 with top-p (the sort) and a
    penalty, beside a full-budget prompt asking prompt logprobs 20."""
    rt = Runtime.from_yaml(
        "qwen3-0.6b", overrides={"engine.max_model_len": 32768, "engine.gpu_memory_utilization": 0.97}
    )
    assert rt.config.engine.max_num_seqs == 256
    engine = rt.config.engine
    assert rt.scheduler.blocks.num_blocks < engine.max_num_seqs * engine.max_model_len // engine.block_size
    g = torch.Generator().manual_seed(0)
    vocab = rt.vocab_size
    prompt = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()  # noqa: E731
    prompts = [prompt(engine.max_num_batched_tokens)] + [prompt(1000) for _ in range(engine.max_num_seqs - 1)]
    params = [SamplingParams(max_tokens=8, prompt_logprobs=20, **WORST)]
    params += [SamplingParams(max_tokens=64, **WORST)] * (engine.max_num_seqs - 1)
    outs = rt.generate(prompts, params)
    free, total = torch.cuda.mem_get_info()
    print(
        f"KV blocks {rt.scheduler.blocks.num_blocks}; free after the run {free / 2**30:.2f} of {total / 2**30:.0f} GiB"
    )
    results = [(o.error, len(o.token_ids)) for o in outs]
    del rt, outs  # the GPU tests after this one need the memory back, pass or fail
    gc.collect()
    torch.cuda.empty_cache()
    assert results == [(None, p.max_tokens) for p in params]
