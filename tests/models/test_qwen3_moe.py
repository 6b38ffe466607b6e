"""Parity with transformers' Qwen3MoeForCausalLM on tiny random checkpoints that have both kinds of layer (fp32, CPU):
the model's logits, and the Runtime's tokens and logprobs through chunked prefill and cached prefixes."""

import math

import pytest
import torch

from qwen3_runtime import SamplingParams, ops
from tests.conftest import TINY_MOE
from tests.models.test_qwen3 import assert_prefill_and_decode_match, load_both

MOE = TINY_MOE["moe"]
SHAPES = {
    "renormalized": TINY_MOE,
    "not-renormalized-top1": dict(TINY_MOE, moe=dict(MOE, norm_topk_prob=False, num_experts_per_tok=1)),
    # layers 1 and 3 sparse (every second), layer 3 made dense by mlp_only_layers; tied embeddings
    "sparse-step-2": dict(
        num_hidden_layers=4, tie_word_embeddings=True, moe=dict(MOE, decoder_sparse_step=2, mlp_only_layers=[3])
    ),
}


@pytest.mark.parametrize(
    "shape, triton_kernels",
    [pytest.param(shape, False, id=f"{name}-pytorch") for name, shape in SHAPES.items()]
    + [pytest.param(TINY_MOE, True, id="renormalized-triton")],  # the kernels have their own tests: one shape here
)
def test_prefill_and_decode_logits_match_transformers(make_checkpoint, monkeypatch, shape, triton_kernels):
    if not triton_kernels:
        monkeypatch.setattr(ops, "TRITON_INTERPRET", False)
    ours, theirs = load_both(make_checkpoint(**shape))
    layers, arch = ours.model.layers, ours.config
    kinds = [type(layer.mlp).__name__ for layer in layers]
    assert kinds == ["SparseMoeBlock" if arch.is_sparse_layer(i) else "DenseMLP" for i in range(len(layers))]
    assert {"SparseMoeBlock", "DenseMLP"} == set(kinds)
    assert_prefill_and_decode_match(ours, theirs)


def _teacher_forced(path, tokens: list[int]) -> torch.Tensor:
    """transformers' log-probabilities [len(tokens), vocab] in float64 (row i: of the token after tokens[i])."""
    import transformers

    model = transformers.Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double().log_softmax(-1)


def test_runtime_matches_transformers_through_chunks_and_a_cached_prefix(make_runtime, tiny_moe_checkpoint):
    """Prompts in chunks of at most 13 tokens; the second shares the first's two full blocks, cached. Greedy tokens,
    their logprobs and the first prompt's logprobs are transformers' (teacher-forced on the same tokens)."""
    shared = [(7 * i) % 500 + 1 for i in range(37)]
    prompts = [shared + [9, 8, 7], shared + list(range(100, 111))]
    rt = make_runtime(tiny_moe_checkpoint, engine__max_num_batched_tokens=13)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)
    first = rt.generate([prompts[0]], SamplingParams(**vars(params) | {"prompt_logprobs": 2}))[0]
    second = rt.generate([prompts[1]], params)[0]
    assert rt.scheduler.blocks.stats().hit_tokens == 32 and rt.stats.prefill_steps >= 6
    for prompt, out in ((prompts[0], first), (prompts[1], second)):
        ref = _teacher_forced(tiny_moe_checkpoint, prompt + out.token_ids)
        assert out.token_ids == ref[len(prompt) - 1 : -1].argmax(-1).tolist()
        for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            assert math.isclose(lp.logprob, ref[len(prompt) - 1 + i, token].item(), abs_tol=1e-4)
    ref = _teacher_forced(tiny_moe_checkpoint, prompts[0])
    assert first.prompt_logprobs[0] is None
    for i, lp in enumerate(first.prompt_logprobs[1:]):
        assert lp.token_id == prompts[0][i + 1]
        assert math.isclose(lp.logprob, ref[i, prompts[0][i + 1]].item(), abs_tol=1e-4)
        assert lp.top_ids[:2] == ref[i].topk(2).indices.tolist()


SAMPLING = {
    "greedy": dict(temperature=0),
    "random": dict(temperature=0.9, seed=1),
    "top-k": dict(temperature=0.8, top_k=5, seed=2),
    "top-k-large": dict(temperature=0.8, top_k=100, seed=3),
    "top-p": dict(temperature=1.0, top_p=0.5, seed=4),
    "min-p": dict(temperature=1.0, min_p=0.2, seed=5),
    "penalties": dict(temperature=0.7, seed=6, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2),
    "bias-min-tokens": dict(temperature=0, logit_bias={3: 2.0}, min_tokens=4),
}


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_every_sampling_variant_alone_and_batched_on_both_logprob_paths(make_runtime, tiny_moe_checkpoint, mode):
    """Each kind of request, alone and in one batch (its own seed, its own tokens), with device logprobs as the
    float64 host scan gives them."""
    prompt = [5, 6, 7, 8] * 3
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3, logprobs_mode=mode, **kw) for kw in SAMPLING.values()
    ]
    device = make_runtime(tiny_moe_checkpoint)
    batched = device.generate([prompt] * len(params), params)
    host = make_runtime(tiny_moe_checkpoint, logprobs__path="host").generate([prompt] * len(params), params)
    for name, p, out, ref in zip(SAMPLING, params, batched, host):
        assert out.error is None and out.token_ids == ref.token_ids, name
        assert out.token_ids == device.generate([prompt], p)[0].token_ids, name
        for got, want in zip(out.logprobs, ref.logprobs):
            assert (got.token_id, got.rank, got.top_ids) == (want.token_id, want.rank, want.top_ids), name
            assert math.isclose(got.logprob, want.logprob, abs_tol=1e-4), name
    assert len(set(map(tuple, (o.token_ids for o in batched)))) > 2  # the variants do differ


def test_async_scheduling_and_preemption_leave_the_tokens_alone(make_runtime, tiny_moe_checkpoint):
    """Steps launched before the last is read, requests preempted for want of blocks and recomputed: the synchronous
    engine's tokens (padded rows in every step, which route to no expert)."""
    prompts = [[i + 1] * (10 + 7 * i) for i in range(5)]
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)
    reference = make_runtime(tiny_moe_checkpoint, engine__async_scheduling=False).generate(prompts, params)
    rt = make_runtime(tiny_moe_checkpoint, engine__num_kv_blocks=6, engine__max_model_len=64, engine__max_num_seqs=4)
    outs = rt.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert rt.scheduler.num_preemptions > 0


def test_batch_invariant_mode_serves_moe(make_runtime, tiny_moe_checkpoint):
    """The router's logits by the batch-invariant kernel and the experts asked for invariance; on the CPU only that
    it serves the default's tokens (the bits are a GPU test's)."""
    prompts = [[3, 1, 4, 1, 5], list(range(10, 30))]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    invariant = make_runtime(tiny_moe_checkpoint, triton_kernels=True, engine__batch_invariant=True)
    outs = invariant.generate(prompts, params)
    reference = make_runtime(tiny_moe_checkpoint).generate(prompts, params)  # after: it turns the interpreter off
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_bf16_through_every_captured_bucket_matches_transformers(make_checkpoint):
    """A small MoE (64 experts, top 8, both layer kinds) written by transformers in bf16 and served on the GPU with
    CUDA graphs, every decode bucket captured: batches of 1, 3 and 8 requests (3 rides bucket 4 with a padded row).
    Against transformers' fp32 forward over the same bf16 weights, teacher-forced on our tokens, our logprobs err
    no more than twice transformers' own bf16 forward does over the whole run, at the worst and on average (one
    prompt alone is no yardstick: bf16 rounding flips near-tied expert choices, moving a logprob by up to ~0.25 in
    either forward), and each greedy token is the fp32 forward's best or within that error of it (random weights
    leave near-ties)."""
    import transformers

    from qwen3_runtime import Runtime

    moe = dict(MOE, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=128, mlp_only_layers=[2])
    path = make_checkpoint(hidden_size=256, num_hidden_layers=4, vocab_size=2048, moe=moe, dtype=torch.bfloat16, seed=1)
    rt = Runtime.from_yaml(
        "tiny",
        overrides={
            "model.path": str(path),
            "engine.device": "cuda",
            "engine.max_num_seqs": 8,
            "engine.max_model_len": 256,
        },
    )
    assert {size for size, _ in rt.runner.graphs.graphs} == set(rt.runner.graphs.buckets) == {1, 2, 4, 8}
    fp32, bf16 = (
        transformers.Qwen3MoeForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
        for dtype in (torch.float32, torch.bfloat16)
    )

    def logprobs(model, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids], device="cuda")).logits[0].double().log_softmax(-1).cpu()

    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=1)
    our_err, their_err, best_gap = [], [], []
    for batch in (1, 3, 8):
        prompts = [torch.randint(0, 2048, (int(n),), generator=gen).tolist() for n in torch.randint(5, 60, (batch,))]
        for prompt, out in zip(prompts, rt.generate(prompts, params)):
            steps = torch.arange(len(out.token_ids)) + len(prompt) - 1
            ref, theirs = (logprobs(m, prompt + out.token_ids)[steps] for m in (fp32, bf16))
            tokens = torch.tensor(out.token_ids)
            chosen = ref[torch.arange(len(tokens)), tokens]
            ours = torch.tensor([lp.logprob for lp in out.logprobs], dtype=torch.float64)
            our_err.append((ours - chosen).abs())
            their_err.append((theirs - ref).gather(1, tokens[:, None]).abs()[:, 0])
            best_gap.append(ref.max(-1).values - chosen)
    rt.close()
    ours, theirs = torch.cat(our_err), torch.cat(their_err)
    tolerance = max(0.02, 2 * theirs.max().item())
    assert ours.max() <= tolerance and ours.mean() <= 2 * theirs.mean() + 1e-3
    assert torch.cat(best_gap).max() <= tolerance
