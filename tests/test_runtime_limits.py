"""engine.max_model_len: the model's context unless set (a checkpoint's config.json, or a random shape's), capped
by what the KV cache holds, with the runner built for the limit it serves."""

import pytest
import torch

from qwen3_runtime import SamplingParams, loader
from qwen3_runtime import device as dev
from qwen3_runtime.kv_cache import kv_bytes_per_block

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.mark.parametrize(
    "checkpoint, overrides, expected",
    [
        (False, {}, 256),  # tiny.yaml's random architecture: max_position_embeddings 256
        (True, {}, 512),  # the checkpoint's config.json
        (True, {"engine__max_model_len": 128}, 128),
    ],
)
def test_max_model_len_is_the_models_context_unless_set(make_runtime, tiny_checkpoint, checkpoint, overrides, expected):
    rt = make_runtime(tiny_checkpoint if checkpoint else None, **overrides)
    assert rt.config.engine.max_model_len == rt.limits.max_model_len == rt.runner.max_model_len == expected


def test_a_kv_cache_holding_less_than_the_context_caps_max_model_len(make_runtime, tiny_checkpoint, monkeypatch):
    """The runner and the profile are built for the checkpoint's 512 tokens, then built again for the 320 that the
    cache's 20 blocks hold."""
    rt = make_runtime(tiny_checkpoint)
    per_block = kv_bytes_per_block(rt.model.config, 16, rt.dtype)
    rt.close()
    monkeypatch.setattr(loader, "check_weights_fit", lambda *_, **__: None)  # so little memory holds no weights either
    monkeypatch.setattr(dev, "host_available_memory", lambda: int(20.5 * per_block / 0.9))
    rt = make_runtime(tiny_checkpoint)
    assert rt.config.engine.max_model_len == rt.limits.max_model_len == 320
    assert rt.scheduler.blocks.num_blocks == 20
    assert rt.runner.max_model_len == 320 and rt.runner.stager.inputs.block_tables.shape[1] == 20
    near_limit, too_long = rt.generate([[1] * 317, [1] * 320], GREEDY)
    assert near_limit.finish_reason == "length" and len(near_limit.token_ids) == 3
    assert "engine.max_model_len=320" in too_long.error


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_context_past_what_the_gpu_holds_is_capped_after_the_profile():
    """Qwen3-0.6B's shape with a context of 524,288 tokens in half the free memory: the runner is built and the
    worst step profiled for that context (the profile's scratch cache holds its longest prompt only), then built
    again for what the cache holds, and a long prompt runs."""
    from qwen3_runtime import Runtime

    overrides = {
        "model.architecture.max_position_embeddings": 2**19,
        "engine.gpu_memory_utilization": 0.5,
        "engine.max_num_seqs": 16,
        "engine.cuda_graph_buckets": [1, 8],
    }
    with Runtime.from_yaml("qwen3-0.6b", overrides) as rt:
        engine = rt.config.engine
        assert engine.max_model_len < 2**19 and engine.max_model_len == rt.runner.max_model_len
        assert engine.max_model_len == rt.scheduler.blocks.num_blocks * engine.block_size
        assert "(what the KV cache holds of the model's 524288)" in str(rt.summary)
        outs = rt.generate([[5, 6, 7], [1] * 5000], GREEDY)
    assert [(out.error, len(out.token_ids)) for out in outs] == [(None, 8), (None, 8)]
