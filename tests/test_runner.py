"""The runner through the public API: logprobs on both paths, prompt logprobs, padding, counters."""

import math
import weakref

import pytest
import torch

from qwen3_runtime import SamplingParams
from qwen3_runtime.logprobs import token_logprob_from_row
from qwen3_runtime.packed_rows import packed_width
from qwen3_runtime.sampling_tail import Sampler, TailVariant
from scripts.profiling import profile_steps

# Joining one per step (_run_joining), the five decode together (padded to 8), then three (to 4), then one: few
# tokens each, as every step runs the Triton kernels in the interpreter in the triton case.
MIXED = [
    ([5, 17, 300, 2], SamplingParams(max_tokens=7, temperature=0, ignore_eos=True, logprobs=5)),
    (list(range(40, 71)), SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)),
    (
        [7] * 13,
        SamplingParams(max_tokens=5, temperature=0.8, top_k=40, seed=3, ignore_eos=True, logprobs=0, prompt_logprobs=3),
    ),
    (
        [9, 9, 1],
        SamplingParams(
            max_tokens=3, temperature=1.0, top_p=0.9, seed=4, ignore_eos=True, logprobs=20, logprobs_mode="processed"
        ),
    ),
    ([100, 200], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1, prompt_logprobs=0)),
]


def _tol(lp):
    return 2e-6 * (1 + abs(lp.logsumexp)) + 1e-6


def _assert_close(a, b):
    """Same token, rank and top ids; logprobs within the reduction's tolerance."""
    assert (a.token_id, a.rank, a.top_ids) == (b.token_id, b.rank, b.top_ids)
    assert math.isclose(a.logprob, b.logprob, rel_tol=0, abs_tol=_tol(b)) or a.logprob == b.logprob
    for x, y in zip(a.top_logprobs, b.top_logprobs):
        assert math.isclose(x, y, rel_tol=0, abs_tol=_tol(b)) or x == y


def _run_joining(rt, requests):
    """Requests join one by one between steps, so the batch changes size (and padding) mid-run."""
    ids, outputs = [], {}
    for prompt, params in requests:
        ids.append(rt.add_request(prompt, params))
        for out in rt.step():
            outputs[out.request_id] = out
    while rt.has_unfinished():
        for out in rt.step():
            outputs[out.request_id] = out
    return [outputs[i] for i in ids]


@pytest.mark.parametrize("triton_kernels", [False, True], ids=["reference", "triton"])
def test_device_and_host_paths_agree_on_a_mixed_batch(make_runtime, tiny_checkpoint, triton_kernels):
    overrides = dict(engine__cuda_graph_buckets=[1, 2, 4, 8], logprobs__prompt_chunk_size=8)
    device = _run_joining(make_runtime(tiny_checkpoint, triton_kernels=triton_kernels, **overrides), MIXED)
    host = _run_joining(
        make_runtime(tiny_checkpoint, triton_kernels=triton_kernels, logprobs__path="host", **overrides), MIXED
    )
    for (prompt, params), d, h in zip(MIXED, device, host):
        assert d.token_ids == h.token_ids and len(d.token_ids) == params.max_tokens
        if params.logprobs is None:
            assert d.logprobs is None
        else:
            assert len(d.logprobs) == len(d.token_ids)
            for tok, a, b in zip(d.token_ids, d.logprobs, h.logprobs):
                assert a.token_id == tok and len(a.top_ids) == params.logprobs
                _assert_close(a, b)
        if params.prompt_logprobs is None:
            assert d.prompt_logprobs is None
        else:
            assert len(d.prompt_logprobs) == len(prompt) and d.prompt_logprobs[0] is None
            for tok, a, b in zip(prompt[1:], d.prompt_logprobs[1:], h.prompt_logprobs[1:]):
                assert a.token_id == tok
                _assert_close(a, b)


def test_prompt_logprobs_match_transformers(make_runtime, tiny_checkpoint):
    import transformers

    prompt = [int(t) for t in torch.randint(0, 512, (40,))]
    rt = make_runtime(tiny_checkpoint, logprobs__prompt_chunk_size=7)
    out = rt.generate([prompt], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=5))[0]
    model = transformers.Qwen3ForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].double()
    for p in range(1, len(prompt)):
        ref = token_logprob_from_row(logits[p - 1], prompt[p], 5)
        got = out.prompt_logprobs[p]
        assert got.rank == ref.rank and got.top_ids[:1] == ref.top_ids[:1]
        assert abs(got.logprob - ref.logprob) < 1e-4


def test_prompt_logprobs_of_both_paths_in_one_prefill(make_runtime, tiny_checkpoint):
    """A full-vocabulary request (host path) beside a device-path one in one prefill: each takes its own
    path, and the device request's packed results (several chunks, one copy) read as the host path's."""
    rt = make_runtime(tiny_checkpoint, logprobs__max_logprobs=-1, logprobs__prompt_chunk_size=6)
    host = make_runtime(tiny_checkpoint, logprobs__path="host")
    prompts = [[5, 9, 2, 7], list(range(30, 60))]
    params = [
        SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=-1),
        SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=3),
    ]
    full, device = rt.generate(prompts, params)
    ref = host.generate([prompts[1]], params[1])[0]
    assert not device.error and len(device.prompt_logprobs) == 30 and device.prompt_logprobs[0] is None
    for a, b in zip(device.prompt_logprobs[1:], ref.prompt_logprobs[1:]):
        _assert_close(a, b)
    assert [len(lp.top_ids) for lp in full.prompt_logprobs[1:]] == [rt.vocab_size] * 3


def test_raw_and_processed_modes(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    base = dict(max_tokens=6, temperature=0.5, seed=11, ignore_eos=True, logprobs=3)
    raw = rt.generate([[1, 2, 3]], SamplingParams(**base))[0]
    processed = rt.generate([[1, 2, 3]], SamplingParams(**base, logprobs_mode="processed"))[0]
    assert raw.token_ids == processed.token_ids
    # Temperature 0.5 sharpens the distribution: the sampled tokens gain log-probability.
    for a, b in zip(raw.logprobs, processed.logprobs):
        assert b.logsumexp != a.logsumexp and b.top_ids == a.top_ids
        assert math.isclose(
            b.top_logprobs[0] - b.top_logprobs[1], 2 * (a.top_logprobs[0] - a.top_logprobs[1]), rel_tol=1e-4
        )
    default_processed = make_runtime(tiny_checkpoint, logprobs__mode="processed")
    again = default_processed.generate([[1, 2, 3]], SamplingParams(**base))[0]
    assert [lp.logprob for lp in again.logprobs] == [lp.logprob for lp in processed.logprobs]


def _always_sort(monkeypatch):
    """Every batch takes the sorting sampler (the variant that serves any batch), penalized as it would be."""
    of = TailVariant.of
    monkeypatch.setattr(
        TailVariant, "of", staticmethod(lambda reqs, mode: of(reqs, mode)._replace(sampler=Sampler.SORT))
    )


def test_a_batch_without_top_k_or_top_p_skips_the_sort(make_runtime, tiny_checkpoint, monkeypatch):
    from qwen3_runtime.sampling_tail import tail

    greedy = SamplingParams(max_tokens=6, temperature=0, top_k=5, ignore_eos=True)  # a greedy row's filters: unused
    plain = SamplingParams(
        max_tokens=6, temperature=0.9, seed=1, ignore_eos=True, logprobs=3, logprobs_mode="processed"
    )
    calls, cutoffs = [], tail.filter_cutoffs
    monkeypatch.setattr(tail, "filter_cutoffs", lambda *a: calls.append(a) or cutoffs(*a))
    prompts = [[5, 6, 7], [8, 9]]
    skipped = make_runtime(tiny_checkpoint).generate(prompts, [greedy, plain])
    assert calls == []
    # The sort changes nothing on such a batch: the same tokens and processed logprobs as the sorting variant.
    _always_sort(monkeypatch)
    sorted_ = make_runtime(tiny_checkpoint).generate(prompts, [greedy, plain])
    assert calls  # the sort
    assert [o.token_ids for o in skipped] == [o.token_ids for o in sorted_]
    assert skipped[1].logprobs == sorted_[1].logprobs


def test_a_long_row_in_a_small_batch_takes_the_graphs_with_more_splits(make_runtime, tiny_checkpoint, monkeypatch):
    """The same tokens and logprobs as with the default splits (the kernels in the interpreter): 2 splits of the
    100-token row's 4 tiles, against 4 of the long rows' 16."""
    from qwen3_runtime import runner
    from qwen3_runtime.ops import decode_attention

    monkeypatch.setattr(runner, "num_sms", lambda device: 16)  # long rows: 16 splits for one row of 2 KV heads
    monkeypatch.setattr(decode_attention, "FEW_PAIRS_SPLITS", 2)
    prompt = [(7 * i) % 500 for i in range(100)]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=3)
    overrides = dict(triton_kernels=True, engine__cuda_graph_buckets=[1, 2])
    default = make_runtime(tiny_checkpoint, **overrides)
    assert default.runner.long_row_splits == {}  # no row reaches LONG_ROW_TOKENS
    expected = default.generate([prompt], params)[0]
    for module in (runner, decode_attention):
        monkeypatch.setattr(module, "LONG_ROW_TOKENS", 90)
    rt = make_runtime(tiny_checkpoint, **overrides)
    assert rt.runner.long_row_splits == {1: 16, 2: 8}
    keys, run = [], rt.runner.graphs.run
    monkeypatch.setattr(rt.runner.graphs, "run", lambda rows, key: keys.append(key) or run(rows, key))
    out = rt.generate([prompt], params)[0]
    assert len(keys) == params.max_tokens - 1 and all(key.long_rows for key in keys)
    assert out.token_ids == expected.token_ids
    for a, b in zip(out.logprobs, expected.logprobs):
        _assert_close(a, b)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_top_k_rows_select_instead_of_sorting_with_the_same_results(make_runtime, tiny_checkpoint, monkeypatch, top_p):
    params = [
        SamplingParams(max_tokens=6, temperature=0.9, top_k=k, top_p=top_p, seed=s, ignore_eos=True, logprobs=3,
                       logprobs_mode="processed")
        for s, k in ((1, 5), (2, 40))
    ] + [SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True, logprobs=2)]  # fmt: skip
    prompts = [[5, 6, 7], [8, 9], [1, 2, 3, 4]]
    selected = make_runtime(tiny_checkpoint).generate(prompts, params)
    _always_sort(monkeypatch)
    sorted_ = make_runtime(tiny_checkpoint).generate(prompts, params)
    assert [o.token_ids for o in selected] == [o.token_ids for o in sorted_]
    assert [o.logprobs for o in selected] == [o.logprobs for o in sorted_]


def test_full_vocabulary_needs_max_logprobs_minus_one(make_runtime, tiny_checkpoint):
    with pytest.raises(ValueError, match=r"logprobs=-1 is out of range"):
        make_runtime(tiny_checkpoint).add_request([1, 2], SamplingParams(logprobs=-1))
    rt = make_runtime(tiny_checkpoint, logprobs__max_logprobs=-1)
    out = rt.generate([[1, 2]], SamplingParams(max_tokens=3, temperature=0, logprobs=-1, ignore_eos=True))[0]
    lp = out.logprobs[0]
    assert len(lp.top_ids) == rt.vocab_size and sorted(lp.top_ids) == list(range(rt.vocab_size))
    assert lp.top_ids[lp.rank - 1] == out.token_ids[0] == lp.token_id
    total = sum(math.exp(v) for v in lp.top_logprobs)
    assert abs(total - 1) < 1e-9


def test_one_device_to_host_copy_per_step(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    params = [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=k) for k in (None, 0, 5, 20)]
    rt.generate([[1, 2, 3]] * 4, params)
    s = rt.stats
    assert (s.prefill_steps, s.decode_steps) == (1, 7)
    assert s.d2h_copies == s.host_syncs == 8
    assert s.d2h_bytes == 8 * 4 * (5 + 2 * 20) * 4  # 4 rows of 45 int32 per step

    host = make_runtime(tiny_checkpoint, logprobs__path="host")
    host.generate([[1, 2, 3]] * 4, params)
    # Plus one full-vocabulary row per step for each of the three rows that asked.
    assert host.stats.d2h_copies == 8 + 3 * 8
    assert host.stats.d2h_bytes == 8 * 4 * 45 * 4 + 3 * 8 * 512 * 4


def test_a_step_is_read_before_the_step_two_after_it_launches(make_runtime, tiny_checkpoint):
    """Results alternate between two buffers: a third launch with the first step unread would overwrite them."""
    rt = make_runtime(tiny_checkpoint)
    rt.add_request([1, 2, 3], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    chunks, _ = rt.scheduler.schedule()
    first = rt.runner.prefill(chunks)
    reqs = list(rt.scheduler.running)
    second = rt.runner.launch_decode(reqs, previous=first)
    with pytest.raises(RuntimeError, match="read"):
        rt.runner.launch_decode(reqs, previous=second)
    rt.runner.collect(first)
    rt.runner.launch_decode(reqs, previous=second)


def test_prompt_logprobs_add_one_copy_and_no_wait(make_runtime, tiny_checkpoint):
    """Every chunk of every prompt lands in one packed copy, read after the prefill's own wait."""
    rt = make_runtime(tiny_checkpoint, logprobs__prompt_chunk_size=4)
    prompts = [list(range(1, 12)), [3, 4, 5]]
    outs = rt.generate(prompts, [SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k) for k in (2, 0)])
    s = rt.stats
    assert (s.prefill_steps, s.decode_steps, s.host_syncs, s.d2h_copies) == (1, 0, 1, 2)
    assert s.d2h_bytes == 2 * 45 * 4 + (10 + 2) * 45 * 4  # the step's 2 rows, then 12 prompt positions
    for prompt, out in zip(prompts, outs):
        assert [lp.token_id for lp in out.prompt_logprobs[1:]] == prompt[1:]


def test_the_rows_sampled_from_join_the_last_prompt_logprobs_product(make_runtime, tiny_checkpoint, monkeypatch):
    """A prefill scoring prompts computes the logits its requests sample from in its last chunk's product, not in
    one of their own: one lm_head product per chunk, each chunk's logits freed before the next product, and the
    same tokens and logprobs as without prompt logprobs."""
    prompts = [list(range(1, 12)), [3, 4, 5], [7, 8, 9, 10]]  # 10 + 2 positions scored: chunks of 4, 4 and 4 + 3
    products, live = [], []  # rows per product, and the products' earlier logits still alive at each

    def run(scored: bool):
        rt = make_runtime(tiny_checkpoint, logprobs__prompt_chunk_size=4)
        products.clear()
        live.clear()
        refs = []
        compute_logits = rt.model.compute_logits

        def product(hidden, **kw):
            products.append(len(hidden))
            live.append(sum(ref() is not None for ref in refs))
            refs.append(weakref.ref(logits := compute_logits(hidden, **kw)))
            return logits

        monkeypatch.setattr(rt.model, "compute_logits", product)
        params = [
            SamplingParams(
                max_tokens=3, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=k if scored else None
            )
            for k in (2, 0)
        ] + [SamplingParams(max_tokens=3, temperature=0.9, seed=5, ignore_eos=True, logprobs=3)]
        outs = rt.generate(prompts, params)
        assert rt.stats.prefill_steps == 1 and len(products) == (3 if scored else 1) + rt.stats.decode_steps
        return outs, list(products)

    scored, scored_products = run(scored=True)
    assert live[:3] == [0, 0, 0]  # at most one chunk of logits at a time
    plain, plain_products = run(scored=False)
    assert scored_products[:3] == [4, 4, 4 + 3] and plain_products[0] == 3  # the prefill's products
    for a, b in zip(scored, plain):
        assert a.token_ids == b.token_ids and a.error is None
        for x, y in zip(a.logprobs, b.logprobs):
            _assert_close(x, y)
    assert [lp.token_id for lp in scored[0].prompt_logprobs[1:]] == prompts[0][1:]


def _check_padded_rows_never_write_the_cache(rt):
    # block 0: where a padded row's (or a prefill's padded token's) slot 0 would land
    reserved = rt.scheduler.blocks.free.popleft()
    assert reserved == 0
    rt.kv_cache.fill_(float("nan"))
    outs = rt.generate([[1, 2, 3], [4, 5], [6]], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 20 and o.error is None for o in outs)
    assert torch.isnan(rt.kv_cache[:, :, reserved]).all()


def test_a_budget_past_what_a_step_can_hold_sizes_no_buffer_past_it(make_runtime, tiny_checkpoint):
    """max_num_batched_tokens far past max_num_seqs x max_model_len (a step never holds more) allocates as much."""
    rt = make_runtime(tiny_checkpoint, engine__max_num_batched_tokens=10**9)
    most = rt.config.engine.max_num_seqs * rt.config.engine.max_model_len
    assert rt.runner.prefill_stager.inputs.tokens.shape[1] == rt.runner.prompt_logprobs.packed.shape[0] == most
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=1)
    assert all(out.error is None for out in rt.generate([[5, 6, 7]] * 3, params))


def test_a_row_restages_its_constants_when_another_request_takes_it(make_runtime, tiny_checkpoint):
    """Request constants are staged only when a row changes hands: the second request, moving into
    row 0 when the first finishes, must bring its own."""
    rt = make_runtime(tiny_checkpoint, engine__cuda_graph_buckets=[2])
    first = rt.add_request([1, 2], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, logprobs=3))
    rt.add_request([3, 4], SamplingParams(max_tokens=6, temperature=0.8, top_k=7, seed=1, ignore_eos=True))
    while all(out.request_id != first for out in rt.step()):
        pass
    rt.step()  # row 0: the second request; row 1: padding
    staged = rt.runner.stager.host
    assert (staged.top_k[:2].tolist(), staged.num_top[:2].tolist(), staged.wants_logprobs[:2].tolist()) == (
        [7, -1],
        [0, 0],
        [0, 0],
    )
    assert staged.temperature[0].item() == pytest.approx(0.8) and staged.seed[0].item() == 1


def test_padded_rows_never_write_the_cache(make_runtime, tiny_checkpoint):
    _check_padded_rows_never_write_the_cache(make_runtime(tiny_checkpoint, engine__cuda_graph_buckets=[4]))


def test_nan_logits_fail_only_that_request(make_runtime, make_checkpoint):
    rt = make_runtime(make_checkpoint(tie_word_embeddings=False))
    rt.model.model.embed_tokens.weight.data[13] = float("nan")  # any prompt holding token 13 turns NaN
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=2)
    outs = rt.generate([[1, 2, 3], [1, 13, 3], [4, 5]], params)
    assert outs[1].finish_reason == "error" and "not finite" in outs[1].error
    assert [len(outs[i].token_ids) for i in (0, 2)] == [5, 5]
    assert outs[0].error is None and outs[2].error is None


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_nan_logits_in_decode_fail_only_that_request(make_runtime, make_checkpoint, async_scheduling):
    checkpoint = make_checkpoint(tie_word_embeddings=False)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)
    free = make_runtime(checkpoint).generate([[4, 5]], params)[0].token_ids
    rt = make_runtime(checkpoint, engine__async_scheduling=async_scheduling)
    rt.model.model.embed_tokens.weight.data[free[2]] = float("nan")  # the step reading that token turns NaN

    outs = rt.generate([[4, 5], [6, 7, 8]], params)

    assert outs[0].finish_reason == "error" and "not finite" in outs[0].error
    assert outs[0].token_ids == free[: free.index(free[2]) + 1] and len(outs[0].logprobs) == len(outs[0].token_ids)
    assert free[2] not in outs[1].token_ids and outs[1].error is None and len(outs[1].token_ids) == 8


# ---- on the GPU ---------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU_OVERRIDES = {"engine.max_model_len": 1024, "engine.max_num_seqs": 16, "engine.max_num_batched_tokens": 4096}
# Engine modes whose results must agree (scripts/repeat_check.py repeats them to catch rare differences).
GPU_MODES = {
    "graph": {"engine.async_scheduling": False},
    "eager": {"engine.cuda_graphs": False},
    "host": {"logprobs.path": "host"},
    "async": {"engine.async_scheduling": True},
}


def _gpu_runtime(config, **overrides):
    from qwen3_runtime import Runtime

    return Runtime.from_yaml(config, overrides={**GPU_OVERRIDES, **overrides})


def _gpu_requests(vocab):
    g = torch.Generator().manual_seed(0)
    prompt = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()
    base = dict(ignore_eos=True)
    penalized = dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2, min_tokens=5)
    penalized["logit_bias"] = {7: 5.0, 11: -100.0}
    sampled_bias = dict(repetition_penalty=1.3, logit_bias={3: 2.5}, **base)
    return [
        (prompt(100), SamplingParams(max_tokens=24, temperature=0, logprobs=5, **base)),
        (prompt(37), SamplingParams(max_tokens=30, temperature=0, **base)),
        (
            prompt(64),
            SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, seed=5, logprobs=20, prompt_logprobs=5, **base),
        ),
        (
            prompt(5),
            SamplingParams(
                max_tokens=20, temperature=1.0, top_k=50, seed=6, logprobs=0, logprobs_mode="processed", **base
            ),
        ),
        (prompt(200), SamplingParams(max_tokens=16, temperature=0, logprobs=1, **base)),
        (prompt(9), SamplingParams(max_tokens=26, temperature=0, prompt_logprobs=0, **base)),
        # Outlives the filtered rows: the last steps take the random variant that skips the sort.
        (prompt(11), SamplingParams(max_tokens=28, temperature=0.8, seed=7, logprobs=3, **base)),
        # Penalized and biased, greedy and sampled (processed logprobs: the pass writes over the logits): the
        # penalized graphs, the bias pass and the counts kept on the device.
        (prompt(40), SamplingParams(max_tokens=20, temperature=0, logprobs=2, **penalized, **base)),
        (
            prompt(23),
            SamplingParams(
                max_tokens=18, temperature=0.8, top_k=20, seed=8, logprobs=1, logprobs_mode="processed", **sampled_bias
            ),
        ),
    ]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("config", ["qwen3-0.6b", "qwen3-4b"])
def test_graph_eager_and_host_paths_agree(config):
    runs = {}
    for name, overrides in GPU_MODES.items():
        rt = _gpu_runtime(config, **overrides)
        runs[name] = _run_joining(rt, _gpu_requests(rt.vocab_size))
        if overrides.get("engine.cuda_graphs", True):  # greedy, random, top_k, filtered x penalized or not
            assert len(rt.runner.graphs.graphs) == 8 * len(rt.runner.graphs.buckets)  # no long rows at this length
            # Every graph's output is the one static logits buffer: none holds logits of its own in the pool.
            assert {out.data_ptr() for _, out in rt.runner.graphs.graphs.values()} == {rt.runner.logits.data_ptr()}
            assert len(rt.runner.prefill_graphs.graphs) == len(rt.runner.prefill_graphs.buckets)
        del rt
        torch.cuda.empty_cache()
    listed = lambda lps: None if lps is None else list(lps)  # noqa: E731
    for g, a in zip(runs["graph"], runs["async"]):  # the same batches, one step launched ahead
        assert g.token_ids == a.token_ids
        assert listed(g.logprobs) == listed(a.logprobs) and listed(g.prompt_logprobs) == listed(a.prompt_logprobs)
    for g, e, h in zip(runs["graph"], runs["eager"], runs["host"]):
        assert g.token_ids == e.token_ids == h.token_ids
        for lps in ((g.logprobs, e.logprobs, h.logprobs), (g.prompt_logprobs, e.prompt_logprobs, h.prompt_logprobs)):
            if lps[0] is None:
                assert lps[1] is None and lps[2] is None
                continue
            for a, b, c in zip(*lps):
                if a is None:
                    continue
                assert (a.token_id, a.rank, a.top_ids, a.logprob) == (b.token_id, b.rank, b.top_ids, b.logprob)
                _assert_close(a, c)


@pytest.mark.gpu
@gpu
def test_padded_rows_never_write_the_cache_in_graphs():
    _check_padded_rows_never_write_the_cache(_gpu_runtime("qwen3-0.6b", **{"engine.cuda_graph_buckets": [4, 16]}))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path, graphs", [("device", True), ("device", False), ("host", True)])
def test_profiler_sees_one_copy_and_one_sync_per_decode_step(path, graphs):
    rt = _gpu_runtime("qwen3-0.6b", **{"logprobs.path": path, "engine.cuda_graphs": graphs})
    ks = (None, 0, 5, 20, None, 1)
    for k in ks:
        rt.add_request([1, 2, 3, 4] * 8, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=k))
    rt.step()  # the prefill
    copies, syncs = profile_steps(rt, 16)
    asking = sum(k is not None for k in ks)
    per_step = 1 if path == "device" else 1 + asking
    print(
        f"{path} graphs={graphs}: {len(copies) / 16} copies of {sorted(set(copies))} bytes and "
        f"{syncs / 16} syncs per step"
    )
    assert len(copies) == 16 * per_step and syncs == 16 * per_step
    packed_bytes = len(ks) * packed_width(20) * 4  # the real rows only, not the bucket's padding
    assert copies.count(packed_bytes) == 16
    assert all(b == rt.vocab_size * 4 for b in copies if b != packed_bytes)


@pytest.mark.gpu
@gpu
def test_long_prompt_logprobs_equal_the_host_reference_in_bounded_memory():
    rt = _gpu_runtime("qwen3-0.6b", **{"engine.max_model_len": 2048, "logprobs.prompt_chunk_size": 256})
    prompt = torch.randint(0, rt.vocab_size, (1024,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=1, temperature=0)
    rt.generate([prompt], params)  # warm-up
    peaks = {}
    for k in (None, 5):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        outs = rt.generate([prompt], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k))
        peaks[k] = torch.cuda.max_memory_allocated() - base
    extra = peaks[5] - peaks[None]
    bound = 256 * rt.vocab_size * 4
    print(f"prompt logprobs extra peak memory: {extra / 2**20:.1f} MiB (bound {bound / 2**20:.1f} MiB)")
    assert extra <= bound + 2**22  # the chunk's logits, plus index and packed tensors of a few KiB
    host = _gpu_runtime("qwen3-0.6b", **{"engine.max_model_len": 2048, "logprobs.path": "host"})
    ref = host.generate([prompt], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=5))[0]
    assert len(outs[0].prompt_logprobs) == 1024
    for a, b in zip(outs[0].prompt_logprobs[1:], ref.prompt_logprobs[1:]):
        _assert_close(a, b)


@pytest.mark.gpu
@gpu
def test_a_long_row_replays_its_own_graphs_as_eager_runs_them():
    """Past LONG_ROW_TOKENS one row decodes with more attention splits, in graphs of its own: the same results."""
    from qwen3_runtime.ops.decode_attention import LONG_ROW_TOKENS

    overrides = {"engine.max_model_len": 2 * LONG_ROW_TOKENS, "engine.cuda_graph_buckets": [1, 2, 4]}
    prompt = torch.randint(0, 1000, (LONG_ROW_TOKENS + 50,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5)
    graphs = _gpu_runtime("qwen3-0.6b", **overrides)
    assert 1 in graphs.runner.long_row_splits  # an H100 or H200: 32 splits for one row of 8 KV heads
    captured = sum(len(graphs.runner.graphs.variants_of(b)) for b in graphs.runner.graphs.buckets)
    assert len(graphs.runner.graphs.graphs) == captured == 8 * (3 + len(graphs.runner.long_row_splits))
    out = graphs.generate([prompt], params)[0]
    eager = _gpu_runtime("qwen3-0.6b", **overrides, **{"engine.cuda_graphs": False}).generate([prompt], params)[0]
    assert out.token_ids == eager.token_ids
    for a, b in zip(out.logprobs, eager.logprobs):
        assert (a.token_id, a.rank, a.top_ids, a.logprob) == (b.token_id, b.rank, b.top_ids, b.logprob)
