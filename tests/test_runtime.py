import dataclasses
import json
import shutil
import typing
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen3_runtime import SamplingParams
from qwen3_runtime.config import Config, ConfigError
from qwen3_runtime.request import PENDING

GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


def _hf_greedy(path, prompt, steps):
    import transformers

    model = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def test_batched_greedy_equals_transformers_generate(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint, triton_kernels=True)
    prompts = [[5, 17, 300, 2], list(range(40, 71)), [7] * 13]
    # 24 tokens (all but the first a decode step, slow in the interpreter): every row's cache crosses a block
    # (16 tokens), the last two rows' also decode attention's 32-token tile.
    outs = rt.generate(prompts, replace(GREEDY, max_tokens=24))
    for prompt, out in zip(prompts, outs):
        assert out.error is None and out.finish_reason == "length"
        assert out.token_ids == _hf_greedy(tiny_checkpoint, prompt, 24)


def test_preemption_recomputes_without_changing_tokens(make_runtime, tiny_checkpoint):
    prompts = [[i + 1] * (10 + 7 * i) for i in range(6)]
    reference = [o.token_ids for o in make_runtime(tiny_checkpoint).generate(prompts, GREEDY)]
    # 10 blocks of 16 tokens cannot hold six sequences of up to 77 tokens at once.
    rt = make_runtime(tiny_checkpoint, engine__num_kv_blocks=10, engine__max_model_len=128)
    outs = rt.generate(prompts, GREEDY)
    assert rt.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == reference
    assert rt.scheduler.blocks.num_free_blocks == 10


@pytest.mark.parametrize(
    "prompt, params, words",
    [
        ([], GREEDY, ["prompt is empty"]),
        ([1] * 513, GREEDY, ["prompt has 513 tokens", "max_model_len=512"]),  # the checkpoint's context
        ([1, 512, 3], GREEDY, ["prompt[1]=512", "[0, 512)"]),
        ([1, -1], GREEDY, ["prompt[1]=-1"]),
        ([1, 2], SamplingParams(stop_token_ids=[9999]), ["stop_token_ids[0]=9999"]),
        ([1, 2], SamplingParams(logprobs=21), ["logprobs=21", "[0, 20]", "max_logprobs"]),
        ([1, 2], SamplingParams(prompt_logprobs=-1), ["prompt_logprobs=-1", "[0, 20]"]),
        ([1, 2], "greedy", ["params='greedy'", "SamplingParams"]),
    ],
)
def test_bad_request_is_rejected_and_the_others_are_served(make_runtime, tiny_checkpoint, prompt, params, words):
    rt = make_runtime(tiny_checkpoint)
    with pytest.raises(ValueError) as err:
        rt.add_request(prompt, params)
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    good = [3, 4, 5]
    outs = rt.generate([good, prompt, good], [GREEDY, params, GREEDY])
    assert outs[1].error == str(err.value) and outs[1].finish_reason == "error" and outs[1].token_ids == []
    assert outs[0].token_ids == outs[2].token_ids and len(outs[0].token_ids) == 32


def test_finish_reasons(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    free = rt.generate([[1, 2, 3]], GREEDY)[0].token_ids
    stop_at = free[4]
    stopped = rt.generate([[1, 2, 3]], SamplingParams(max_tokens=32, temperature=0, stop_token_ids=[stop_at]))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free[: free.index(stop_at) + 1]
    near_limit = rt.generate([[1] * 506], GREEDY)[0]  # max_model_len 512: the checkpoint's
    assert near_limit.finish_reason == "length" and len(near_limit.token_ids) == 6


def test_eos_stops_unless_ignored(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    free = rt.generate([[9, 8, 7]], GREEDY)[0].token_ids
    rt.eos_token_ids = {free[2]}
    stopped = rt.generate([[9, 8, 7]], SamplingParams(max_tokens=32, temperature=0))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free[: free.index(free[2]) + 1]
    assert rt.generate([[9, 8, 7]], GREEDY)[0].token_ids == free


def test_seeded_sampling_does_not_depend_on_the_batch(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    seeded = SamplingParams(max_tokens=16, temperature=0.8, top_k=50, top_p=0.9, seed=1234, ignore_eos=True)
    alone = rt.generate([[4, 5, 6]], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=16, temperature=1.0, seed=s, ignore_eos=True) for s in range(4)]
    mixed = rt.generate([[1, 2], [4, 5, 6], [8] * 20, [3]], [others[0], seeded, others[1], GREEDY])
    assert mixed[1].token_ids == alone
    assert rt.generate([[4, 5, 6]], seeded)[0].token_ids == alone
    unseeded = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    assert rt.generate([[4, 5, 6]], unseeded)[0].token_ids != alone  # distinct seeds drawn


def test_metrics_are_filled(make_runtime, tiny_checkpoint):
    out = make_runtime(tiny_checkpoint).generate([[1, 2, 3]], GREEDY)[0]
    m = out.metrics
    assert m.arrival_time <= m.first_token_time <= m.finished_time


def _results(outs):
    return [(o.token_ids, o.finish_reason, o.error, None if o.logprobs is None else list(o.logprobs)) for o in outs]


def _overlaps(rt) -> list[tuple[str, bool, bool]]:
    """Spy: for each launch, its kind ("decode" or "prefill"), whether an earlier launched step was still
    unread, and whether a request asking for logprobs was in either step."""
    runner, unread, seen = rt.runner, [], []
    collect = runner.collect

    def spy(kind, launch):
        def launched(batch, *args, **kwargs):
            reqs = [getattr(row, "req", row) for row in batch]  # a prefill's chunks name their requests
            rows = reqs + [req for step in unread for req in step.reqs]
            seen.append((kind, bool(unread), any(req.params.logprobs is not None for req in rows)))
            unread.append(launch(batch, *args, **kwargs))
            return unread[-1]

        return launched

    def spy_collect(step):
        unread.remove(step)
        return collect(step)

    runner.launch_decode, runner.prefill = spy("decode", runner.launch_decode), spy("prefill", runner.prefill)
    runner.collect = spy_collect
    return seen


@pytest.mark.parametrize("path", ["device", "host"])
def test_async_scheduling_gives_the_same_results(make_runtime, tiny_checkpoint, path):
    prompts = [[i + 1] * (10 + 7 * i) for i in range(6)] + [[2] * 124]  # the last ends at max_model_len
    free = make_runtime(tiny_checkpoint).generate([prompts[1]], GREEDY)[0].token_ids
    params = [
        GREEDY,
        SamplingParams(max_tokens=32, temperature=0, stop_token_ids=[free[5]], logprobs=5),  # stops early
        SamplingParams(max_tokens=7, temperature=0.9, top_p=0.9, seed=3, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=1.0, top_k=20, seed=8, ignore_eos=True),
        GREEDY,
        GREEDY,
    ]
    # Few blocks and rows: preemptions and admissions while steps are in flight.
    config = dict(engine__num_kv_blocks=9, engine__max_model_len=128, engine__max_num_seqs=4, logprobs__path=path)
    reference = make_runtime(tiny_checkpoint, engine__async_scheduling=False, **config).generate(prompts, params)
    rt = make_runtime(tiny_checkpoint, engine__async_scheduling=True, **config)
    overlaps = _overlaps(rt)

    outs = rt.generate(prompts, params)

    # The same tokens; logprobs within rounding: a step launched before the one in flight is read does not yet
    # know which rows that step ends, so a row may decode where it rode in a prefill step (other kernels).
    assert [r[:3] for r in _results(outs)] == [r[:3] for r in _results(reference)]
    for out, expected in zip(outs, reference):
        _close_logprobs(out.logprobs, expected.logprobs)
    assert outs[1].finish_reason == "stop" and outs[1].token_ids[-1] == free[5]
    assert outs[6].finish_reason == "length" and len(outs[6].token_ids) == 4
    assert rt.scheduler.num_preemptions > 0 and rt.scheduler.blocks.num_free_blocks == 9
    # Launched ahead of the read, except around host-path rows: those read the step's logits after it.
    assert not rt.has_unfinished()
    assert {kind for kind, overlap, _ in overlaps if overlap} == {"decode", "prefill"}
    assert any(overlap and logprobs for _, overlap, logprobs in overlaps) == (path == "device")


def _drain(rt, limit=500):
    """Step until nothing is left; returns the finished outputs by id and every update taken."""
    finished, updates = {}, []
    for _ in range(limit):
        if not rt.has_unfinished():
            break
        finished.update((out.request_id, out) for out in rt.step())
        updates += rt.take_updates()
    return finished, updates


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_streamed_updates_add_up_to_the_outputs(make_runtime, tiny_checkpoint, async_scheduling):
    """Requests join while others run; each step's updates carry exactly the tokens and logprobs the
    final output has, the prompt logprobs with the first, and the finish reason with the last."""
    rt = make_runtime(tiny_checkpoint, engine__async_scheduling=async_scheduling)
    params = SamplingParams(max_tokens=9, temperature=0.8, seed=3, logprobs=2, prompt_logprobs=1, ignore_eos=True)
    first = rt.add_request([1, 2, 3], params, stream=True)
    for _ in range(3):
        rt.step()
    later = rt.add_request([4, 5], params, stream=True)
    quiet = rt.add_request([6, 7], params)  # not streamed: no updates
    finished, updates = _drain(rt)
    for request_id in (first, later):
        mine = [u for u in updates if u.request_id == request_id]
        out = finished[request_id]
        assert [t for u in mine for t in u.token_ids] == out.token_ids
        assert [lp for u in mine for lp in u.logprobs] == out.logprobs
        assert mine[0].prompt_logprobs == out.prompt_logprobs and all(u.prompt_logprobs is None for u in mine[1:])
        assert [u.finish_reason for u in mine] == [None] * (len(mine) - 1) + ["length"]
    assert quiet in finished and all(u.request_id != quiet for u in updates)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_abort_frees_the_blocks_at_once_and_ends_the_request(make_runtime, tiny_checkpoint, async_scheduling):
    rt = make_runtime(tiny_checkpoint, engine__async_scheduling=async_scheduling)
    total = rt.scheduler.blocks.num_free_blocks
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    doomed = rt.add_request(list(range(1, 40)), params, stream=True)
    kept = rt.add_request([9, 8, 7], params)
    for _ in range(5):
        rt.step()
    rt.abort(doomed)
    assert rt.scheduler.blocks.num_free_blocks == total - len(rt.scheduler.running[0].block_table)
    rt.abort(doomed)  # again, and an unknown id: ignored
    rt.abort(12345)
    finished, updates = _drain(rt)
    assert finished[doomed].finish_reason == "abort" and PENDING not in finished[doomed].token_ids
    assert [u.finish_reason for u in updates if u.request_id == doomed][-1] == "abort"
    alone = make_runtime(tiny_checkpoint).generate([[9, 8, 7]], params)[0]
    assert finished[kept].token_ids == alone.token_ids
    assert rt.scheduler.blocks.num_free_blocks == total


def test_text_and_chat_prompts_go_through_the_tokenizer(make_runtime):
    rt = make_runtime()  # configs/tiny.yaml: Qwen3's vocabulary and tokenizer
    chat = [{"role": "user", "content": "What is 2+2?"}]
    ids = [rt.tokenizer.encode("What is 2+2?"), rt.tokenizer.encode(rt.tokenizer.apply_chat_template(chat))]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    by_text = rt.generate(["What is 2+2?", chat, ""], params)
    assert [out.prompt_token_ids for out in by_text[:2]] == ids
    assert [out.token_ids for out in by_text[:2]] == [out.token_ids for out in rt.generate(ids, params)]
    assert by_text[2].error == "prompt is empty: a request needs at least one prompt token id"
    # vLLM's LLM.chat takes the template's variables: Qwen3's enable_thinking=False pre-fills an empty think block
    (direct,) = rt.generate([chat], params, chat_template_kwargs={"enable_thinking": False})
    rendered = rt.tokenizer.apply_chat_template(chat, enable_thinking=False)
    assert direct.prompt_token_ids == rt.tokenizer.encode(rendered) != ids[1] and rendered.endswith("</think>\n\n")


def test_one_prompt_of_any_kind_and_chat_content_parts(make_runtime):
    """generate() takes a single text, token ids or chat (as vLLM's LLM.generate does); a message's text parts are
    joined with newlines, a part that is not text fails its request."""
    rt = make_runtime()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    chat = [{"role": "user", "content": "Hi\nthere"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    ids = rt.tokenizer.encode("Hi")
    for one, many in [("Hi", ["Hi"]), (ids, [ids]), (parts, [chat])]:
        (single,), (listed,) = rt.generate(one, params), rt.generate(many, params)
        assert (single.prompt_token_ids, single.token_ids) == (listed.prompt_token_ids, listed.token_ids)
    (image,) = rt.generate([[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]], params)
    assert image.error.startswith("prompt[0].content[0]={'type': 'image_url'")


def test_generate_beside_requests_added_before(make_runtime, tiny_checkpoint):
    """generate() returns its own outputs; a request added before runs beside them, its output kept for step()."""
    rt = make_runtime(tiny_checkpoint)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    early = rt.add_request([1, 2], params)
    (out,) = rt.generate([[3, 4, 5]], params)
    assert len(out.token_ids) == 3 and out.request_id != early
    later = []
    while rt.has_unfinished():
        later += rt.step()
    assert [o.request_id for o in later] == [early] and later[0].token_ids == rt.generate([[1, 2]], params)[0].token_ids


def test_generate_without_params_takes_the_checkpoints_generation_config(make_runtime, tiny_checkpoint, tmp_path):
    """As vLLM's LLM: no params means the model creator's defaults; model.generation_config=neutral ignores them."""
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, path)
    (path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_k": 20, "max_new_tokens": 3}))
    rt = make_runtime(path)
    assert rt.default_sampling_params() == SamplingParams(temperature=0.0, top_k=20, max_tokens=3)
    (out,) = rt.generate([1, 2])
    greedy = SamplingParams(max_tokens=3, temperature=0)
    assert out.token_ids == rt.generate([1, 2], greedy)[0].token_ids
    neutral = make_runtime(path, model__generation_config="neutral")
    assert neutral.default_sampling_params() == SamplingParams()


def test_yarn_serves_its_context_past_max_position_embeddings(make_runtime, make_checkpoint, monkeypatch):
    """As vLLM: YaRN's context is its original one times the factor, whatever max_position_embeddings says (Qwen3's
    config.json keeps 40,960 while YaRN 4 × 32,768 serves 131,072)."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 1e4}
    path = make_checkpoint(rope_parameters=yarn)  # max_position_embeddings 512
    rt = make_runtime(path, engine__max_model_len=1024, engine__max_num_batched_tokens=1024)
    (out,) = rt.generate([[5] * 1000], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 24  # the context's last position
    from qwen3_runtime import engine_setup

    monkeypatch.setattr(engine_setup, "load_model", lambda *_: pytest.fail("the weights load before the check"))
    with pytest.raises(ConfigError, match=r"engine.max_model_len=1025 is out of range: .* context=1024"):
        make_runtime(path, engine__max_model_len=1025)


def test_text_the_tokenizer_cannot_read_fails_its_request_alone(make_runtime):
    """An unpaired surrogate (bytes that are not UTF-8, decoded with surrogateescape as argv is) in a text prompt or
    a chat message: that request's ValueError names the prompt; the others run."""
    rt = make_runtime()
    bad_text, bad_chat = "ab\udcffcd", [{"role": "user", "content": "\ud800"}]
    for prompt in (bad_text, bad_chat):
        with pytest.raises(ValueError, match=r"^prompt is not valid text: it holds an unpaired surrogate U\+D[C8]"):
            rt.add_request(prompt, SamplingParams())
    outs = rt.generate([bad_text, "What is 2+2?", bad_chat], SamplingParams(max_tokens=2))
    assert [out.error is None for out in outs] == [False, True, False] and len(outs[1].token_ids) == 2


def _close_logprobs(a, b, tol=1e-4):
    """Two runs' logprob entries: the same tokens and ranks, values within tol."""
    if a is None or b is None:
        assert a is b
        return
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert (x.token_id, x.rank, x.top_ids) == (y.token_id, y.rank, y.top_ids)
            assert abs(x.logprob - y.logprob) < tol and abs(x.logsumexp - y.logsumexp) < tol


def test_chunked_and_prefix_cached_prefills_equal_a_cold_whole_prefill(make_runtime, tiny_checkpoint):
    shared = [(7 * i) % 500 + 1 for i in range(37)]  # 2 full blocks of 16, and 5 tokens more
    prompts = [shared + [9, 8, 7], shared + list(range(100, 133)), shared[:32], shared + [3] * 60]
    params = [
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5),
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5, prompt_logprobs=5),
        SamplingParams(max_tokens=8, temperature=0.8, top_k=40, seed=5, ignore_eos=True, logprobs=3),
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, prompt_logprobs=2),
    ]
    cold = make_runtime(tiny_checkpoint, engine__prefix_caching=False).generate(prompts, params)
    chunked = make_runtime(tiny_checkpoint, engine__prefix_caching=False, engine__max_num_batched_tokens=13)
    cached = make_runtime(tiny_checkpoint, engine__max_num_batched_tokens=24)
    cached.generate([shared + [1]], SamplingParams(max_tokens=2))  # leaves the shared blocks cached
    for rt in (chunked, cached):
        outs = rt.generate(prompts, params)
        for out, ref in zip(outs, cold):
            assert out.token_ids == ref.token_ids and out.error is None
            _close_logprobs(out.logprobs, ref.logprobs)
            _close_logprobs(out.prompt_logprobs, ref.prompt_logprobs)
    assert chunked.stats.prefill_steps > 10
    stats = cached.scheduler.blocks.stats()
    # The requests without prompt logprobs reuse the shared blocks: both for the first, one for the third,
    # which is those two blocks exactly and computes its last one again; the warm-up found nothing.
    assert stats.hit_tokens == 32 + 16 and stats.query_tokens == 38 + 40 + 32 and stats.num_used == 0


def test_decoding_requests_go_on_while_a_long_prompt_is_prefilled_in_chunks(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint, engine__max_num_batched_tokens=16)
    steps = []
    prefill, launch_decode = rt.runner.prefill, rt.runner.launch_decode
    rt.runner.prefill = lambda chunks, *a: steps.append("P") or prefill(chunks, *a)
    rt.runner.launch_decode = lambda reqs, *a: steps.append("D") or launch_decode(reqs, *a)
    short = rt.add_request([5, 6, 7], GREEDY)
    rt.step()  # the short prompt's prefill
    long = rt.add_request(list(range(1, 161)), GREEDY)  # eleven chunks of 15: the decoding row takes a token
    while not rt._live[long].output or rt._live[long].output[0] == PENDING:
        rt.step()
    # The short one decodes in every chunk's step; the last chunk's token is read once the next step is launched.
    assert "".join(steps) == "P" * 12 + "D"
    assert len(rt._live[short].output) == 13


def test_batch_invariant_mode_runs_prefill_steps_only_and_matches_the_default(make_runtime, tiny_checkpoint):
    """On the CPU only the mode's scheduling is checked (the interpreter's dots are numpy's); the bits are
    compared on the GPU below."""
    prompts = [[3, 1, 4, 1, 5], list(range(10, 50)), [9] * 17]
    params = [
        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=3),
        SamplingParams(max_tokens=4, temperature=0.8, seed=3, ignore_eos=True, logprobs=2, prompt_logprobs=2),
        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
    ]
    rt = make_runtime(tiny_checkpoint, triton_kernels=True, engine__batch_invariant=True)
    outs = rt.generate(prompts, params)
    ref = make_runtime(tiny_checkpoint).generate(prompts, params)  # after: it turns the interpreter off
    assert rt.stats.decode_steps == 0 and rt.stats.prefill_steps >= 4
    for out, expected in zip(outs, ref):
        assert out.token_ids == expected.token_ids and out.error is None
        _close_logprobs(out.logprobs, expected.logprobs)
        _close_logprobs(out.prompt_logprobs, expected.prompt_logprobs)


def test_batch_invariant_mode_needs_triton_kernels(make_runtime, tiny_checkpoint):
    with pytest.raises(ConfigError, match="engine.batch_invariant"):
        make_runtime(tiny_checkpoint, engine__batch_invariant=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batch_invariant_requests_are_the_same_bits_alone_and_in_any_batch():
    """Each request alone against all of them at once in chunks of 48 tokens, preempted for want of blocks and
    hitting a cached prefix: the same tokens and the same logprobs, to the bit (Qwen3-0.6B's shape, bf16)."""
    from qwen3_runtime import Runtime

    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, 151643, (150,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 151643, (n,), generator=g).tolist() for n in (5, 37, 90, 131)]
    prompts += [torch.randint(0, 151643, (n,), generator=g).tolist() for n in (1, 64, 203, 250)]
    params = [
        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=5),
        SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True, logprobs=5, prompt_logprobs=3),
        SamplingParams(max_tokens=24, temperature=0.7, top_p=0.8, top_k=20, seed=9, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, repetition_penalty=1.2, logprobs=1),
    ] * 2
    base = {"engine.batch_invariant": True, "engine.max_model_len": 512, "engine.max_num_seqs": 16}
    alone = Runtime.from_yaml("qwen3-0.6b", overrides={**base, "engine.prefix_caching": False})
    expected = [alone.generate([p], q)[0] for p, q in zip(prompts, params)]
    del alone
    together = Runtime.from_yaml(
        "qwen3-0.6b", overrides={**base, "engine.max_num_batched_tokens": 48, "engine.num_kv_blocks": 60}
    )
    together.generate([shared + [1]], SamplingParams(max_tokens=2))  # leaves the shared prefix cached
    outs = together.generate(prompts, params)
    assert together.scheduler.num_preemptions > 0 and together.scheduler.blocks.hit_tokens > 0
    for out, ref in zip(outs, expected):
        assert out.error is None and out.token_ids == ref.token_ids
        assert out.logprobs == ref.logprobs and out.prompt_logprobs == ref.prompt_logprobs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_long_prompt_scores_alike_through_cudnn_and_the_paged_kernel(monkeypatch):
    """A 3,000-token prompt prefilled whole (its attention by cuDNN) and in chunks of 512 (the paged kernel,
    each chunk after the cached ones): the prompt's logprobs agree within bf16's rounding (Qwen3-0.6B's shape,
    random weights)."""
    from qwen3_runtime import Runtime
    from qwen3_runtime.ops import prefill_attention

    prompt = torch.randint(0, 151643, (3000,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, prompt_logprobs=0)
    paged_calls = []
    paged_kernel = prefill_attention.paged_prefill_attention
    monkeypatch.setattr(
        prefill_attention, "paged_prefill_attention", lambda *a, **kw: paged_calls.append(1) or paged_kernel(*a, **kw)
    )
    logprobs = {}
    for budget in (4096, 512):
        base = {"engine.max_model_len": 4096, "engine.max_num_seqs": 4, "engine.cuda_graphs": False}
        rt = Runtime.from_yaml("qwen3-0.6b", overrides={**base, "engine.max_num_batched_tokens": budget})
        paged_calls.clear()
        out = rt.generate([prompt], params)[0]
        assert out.error is None and len(paged_calls) == (
            0 if budget == 4096 else 6 * rt.model.config.num_hidden_layers
        )
        logprobs[budget] = torch.tensor([entry.logprob for entry in out.prompt_logprobs[1:]])
        del rt
        torch.cuda.empty_cache()
    diff = (logprobs[4096] - logprobs[512]).abs()
    print(f"|whole - chunked| prompt logprobs: mean {diff.mean():.2e}, max {diff.max():.2e}")
    assert diff.mean() < 0.02 and diff.max() < 0.15


_SHARED_PREFIX = [(11 * i) % 500 + 1 for i in range(32)]  # prompts start with some of it: prefix-cache hits
_FREQUENT_TOKENS = [150, 18, 373, 27, 426, 251, 195, 177, 164, 297]  # in the checkpoint's outputs: stop ids that stop
_FUZZ_PARAMS = [
    dict(temperature=0),
    dict(temperature=1.0, seed=4),
    dict(temperature=0.8, seed=9, top_k=5, top_p=0.7),
    dict(temperature=0, presence_penalty=0.5, repetition_penalty=1.2),
    dict(temperature=0.9, seed=2, logit_bias={7: 5.0, 40: -100.0}),
]


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples each run: fresh ones might meet a near-tie that batching flips
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_sequence_of_requests_aborts_and_steps_gives_each_request_its_tokens_alone(
    make_runtime, tiny_checkpoint, data
):
    """Requests added and aborted between steps of an engine with few blocks and rows (preemptions), a small
    token budget (chunks) and a shared prefix (cache hits): each request not aborted gets the tokens, finish
    reason and logprobs it gets alone, and every block comes back."""
    blocks = data.draw(st.sampled_from([8, 8, 10, 24]))  # of 8 tokens: 8 hold one sequence of max_model_len
    max_seqs = data.draw(st.integers(2, 4))
    config = dict(
        engine__num_kv_blocks=blocks,
        engine__block_size=8,
        engine__max_model_len=64,
        engine__max_num_seqs=max_seqs,
        engine__max_num_batched_tokens=data.draw(st.sampled_from([max_seqs, 8, 64])),
        engine__async_scheduling=data.draw(st.booleans()),
        engine__prefix_caching=data.draw(st.booleans()),
        logprobs__path=data.draw(st.sampled_from(["device", "host"])),
    )
    rt = make_runtime(tiny_checkpoint, **config)
    added, aborted, finished = {}, set(), {}
    for op in data.draw(st.lists(st.sampled_from(["add", "add", "abort", "step", "step"]), min_size=4, max_size=40)):
        if op == "add":
            prompt = _SHARED_PREFIX[: data.draw(st.integers(1, 32))]
            prompt += data.draw(st.lists(st.integers(1, 499), max_size=8))
            max_tokens = data.draw(st.integers(1, 32))
            params = SamplingParams(
                max_tokens=max_tokens,
                stop_token_ids=data.draw(st.sampled_from([[], _FREQUENT_TOKENS])),
                min_tokens=min(max_tokens, data.draw(st.sampled_from([0, 0, 3]))),
                logprobs=data.draw(st.sampled_from([None, 0, 3])),
                prompt_logprobs=data.draw(st.sampled_from([None, None, None, 1])),
                **data.draw(st.sampled_from(_FUZZ_PARAMS)),
            )
            added[rt.add_request(prompt, params, stream=data.draw(st.booleans()))] = (prompt, params)
        elif op == "abort" and added:
            request_id = data.draw(st.sampled_from(sorted(added)))
            rt.abort(request_id)  # also one that has finished, or was aborted before: ignored
            aborted.add(request_id)
        else:
            finished.update((out.request_id, out) for out in rt.step())
    more, _ = _drain(rt)
    finished.update(more)

    assert finished.keys() == added.keys() and rt.scheduler.blocks.num_free_blocks == blocks
    alone = make_runtime(tiny_checkpoint, engine__prefix_caching=False, engine__max_model_len=64)
    for request_id, out in finished.items():
        assert PENDING not in out.token_ids and out.error is None
        if out.finish_reason == "abort":
            assert request_id in aborted
            continue
        prompt, params = added[request_id]
        expected = alone.generate([prompt], params)[0]
        assert (out.token_ids, out.finish_reason) == (expected.token_ids, expected.finish_reason)
        _close_logprobs(out.logprobs, expected.logprobs)
        _close_logprobs(out.prompt_logprobs, expected.prompt_logprobs)


def _config_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of a config dataclass, the sections' own keys too."""
    keys = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        section = next((t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t)), None)
        keys += [f"{prefix}{f.name}", *(_config_keys(section, f"{prefix}{f.name}.") if section else [])]
    return keys


# Odd values of every type; the numbers small, or so large that nothing of their size can be allocated.
_ODD_VALUES = [0, -1, 1, 2, 3, 7, 2**31, 2**63, 2**64, 10**12, float("nan"), float("inf"), 0.5, -0.5, "", "x", "cpu"]
_ODD_VALUES += ["cuda", "float16", "host", True, False, None, [], [1], [[1]], [-1], {}, {"a": 1}]


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(overrides=st.dictionaries(st.sampled_from(_config_keys(Config)), st.sampled_from(_ODD_VALUES), max_size=3))
def test_any_value_of_any_config_key_makes_an_engine_or_a_config_error(make_runtime, overrides):
    """Never a traceback from a config: the engine builds and serves a request, or a ConfigError (or a request's
    ValueError) says what is wrong."""
    try:
        rt = make_runtime(**{"engine__device": "cpu", **{key.replace(".", "__"): v for key, v in overrides.items()}})
        assert rt.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].error is None
    except (ConfigError, ValueError):
        pass
