"""Penalties through the runtime: greedy tokens against a transformers loop with vLLM's penalties written out,
min_tokens against a forced EOS, batch independence, and penalty slots freed when requests end."""

import json
import math
from dataclasses import replace

import pytest
import torch

from qwen3_runtime import SamplingParams

PENALIZED = dict(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.3)


def _penalize(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams) -> torch.Tensor:
    """vLLM V1's logit bias, then its penalties, on one row of logits."""
    logits = logits.clone()
    for token, bias in (p.logit_bias or {}).items():
        logits[token] += bias
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=len(logits)).float()
    seen = counts > 0
    seen[prompt] = True
    r = torch.tensor(p.repetition_penalty, dtype=torch.float32)
    logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    return logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()


def _reference_greedy(path, prompt: list[int], p: SamplingParams) -> tuple[list[int], list[float], list[float]]:
    """Tokens, raw and processed logprobs of a penalized greedy request, one transformers forward per token."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    output, raw, processed = [], [], []
    with torch.no_grad():
        for _ in range(p.max_tokens):
            logits = model(torch.tensor([prompt + output])).logits[0, -1].float()
            penalized = _penalize(logits, prompt, output, p)
            token = int(penalized.argmax())
            raw.append(logits.double().log_softmax(-1)[token].item())
            processed.append(penalized.double().log_softmax(-1)[token].item())
            output.append(token)
    return output, raw, processed


def test_penalized_greedy_equals_a_reference_loop(make_runtime, each_family_checkpoint):
    tiny_checkpoint = each_family_checkpoint
    rt = make_runtime(tiny_checkpoint)
    prompt = [5, 6, 7, 8] * 4
    base = dict(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)
    plain = rt.generate([prompt], SamplingParams(**base))[0]
    params = SamplingParams(**base, **PENALIZED)
    raw, processed = rt.generate([prompt] * 2, [params, SamplingParams(**base, **PENALIZED, logprobs_mode="processed")])
    tokens, raw_ref, processed_ref = _reference_greedy(tiny_checkpoint, prompt, params)
    assert raw.token_ids == processed.token_ids == tokens != plain.token_ids
    for lp, ref in ((raw, raw_ref), (processed, processed_ref)):
        for got, want in zip(lp.logprobs, ref):
            assert math.isclose(got.logprob, want, abs_tol=1e-4)
    assert [lp.logprob for lp in raw.logprobs] != [lp.logprob for lp in processed.logprobs]


def test_logit_bias_with_penalties_equals_a_reference_loop(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    prompt = [5, 6, 7, 8] * 4
    base = dict(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    plain = rt.generate([prompt], SamplingParams(**base))[0].token_ids
    # The plain run's first pick banned, two others pushed up (once generated, the repetition penalty applies to
    # the biased logit).
    banned = plain[0]
    params = SamplingParams(**base, **PENALIZED, logit_bias={banned: -100, 9: 3.5, 40: 0.25})
    biased = rt.generate([prompt], replace(params, logprobs_mode="processed"))[0]
    tokens, _, processed_ref = _reference_greedy(tiny_checkpoint, prompt, params)
    assert biased.token_ids == tokens and banned not in tokens and 9 in tokens
    for got, want in zip(biased.logprobs, processed_ref):
        assert math.isclose(got.logprob, want, abs_tol=1e-4)


def test_a_large_bias_decides_what_is_sampled(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    base = dict(max_tokens=6, ignore_eos=True)
    plain = rt.generate([[1, 2, 3]], SamplingParams(**base, temperature=0))[0].token_ids
    outs = rt.generate(
        [[1, 2, 3]] * 4,
        [
            SamplingParams(**base, temperature=1.0, seed=3, logit_bias={40: 100}),
            SamplingParams(**base, temperature=0.7, top_k=5, top_p=0.9, seed=1, logit_bias={40: 100}),
            SamplingParams(**base, temperature=0, logit_bias=dict.fromkeys(plain, -100)),
            SamplingParams(**base, temperature=0),  # beside them, unchanged
        ],
    )
    assert outs[0].token_ids == outs[1].token_ids == [40] * 6
    assert not set(plain) & set(outs[2].token_ids) and outs[3].token_ids == plain


def test_penalized_sampled_rows_report_what_was_sampled_from(make_runtime, tiny_checkpoint):
    """A seeded, penalized, temperature-scaled row beside a plain one: processed logprobs are of the penalized
    logits over the temperature, raw ones of the logits themselves (transformers, teacher-forced on its tokens)."""
    import transformers

    rt = make_runtime(tiny_checkpoint)
    prompt = [5, 6, 7, 8] * 4
    base = dict(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True, logprobs=0, **PENALIZED)
    raw, processed = rt.generate(
        [prompt] * 3,
        [SamplingParams(**base), SamplingParams(**base, logprobs_mode="processed"), SamplingParams(max_tokens=8)],
    )[:2]
    assert raw.token_ids == processed.token_ids
    model = transformers.Qwen3ForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    params = SamplingParams(**base)
    with torch.no_grad():
        for step, token in enumerate(raw.token_ids):
            output = raw.token_ids[:step]
            logits = model(torch.tensor([prompt + output])).logits[0, -1].float()
            penalized = _penalize(logits, prompt, output, params) / params.temperature
            want_raw = logits.double().log_softmax(-1)[token].item()
            want_processed = penalized.double().log_softmax(-1)[token].item()
            assert math.isclose(raw.logprobs[step].logprob, want_raw, abs_tol=1e-4)
            assert math.isclose(processed.logprobs[step].logprob, want_processed, abs_tol=1e-4)


@pytest.fixture
def eos_forced(make_runtime, make_checkpoint, monkeypatch):
    """A runtime whose model always ranks EOS (id 11) first and stop id 22 second."""
    path = make_checkpoint()
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 11}))

    def make(**overrides):
        rt = make_runtime(path, **overrides)
        compute_logits = rt.model.compute_logits

        def forced(hidden, out=None, **options):
            logits = compute_logits(hidden, out, **options)
            logits[:, 11], logits[:, 22] = 1e4, 5e3
            return logits

        monkeypatch.setattr(rt.model, "compute_logits", forced)
        return rt

    return make


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_min_tokens_holds_back_eos_and_stop_ids(eos_forced, async_scheduling):
    rt = eos_forced(engine__async_scheduling=async_scheduling)
    assert rt.eos_token_ids == {11}
    greedy = dict(max_tokens=10, temperature=0)
    outs = rt.generate(
        [[1, 2, 3]] * 5,
        [
            SamplingParams(**greedy),
            SamplingParams(**greedy, min_tokens=3),
            SamplingParams(**greedy, min_tokens=4, stop_token_ids=[22]),
            SamplingParams(**greedy, min_tokens=2, ignore_eos=True, stop_token_ids=[22]),
            SamplingParams(max_tokens=10, temperature=0.9, seed=3, min_tokens=5, stop_token_ids=[22]),
        ],
    )
    assert outs[0].token_ids == [11] and outs[0].finish_reason == "stop"
    assert outs[1].token_ids == [22, 22, 22, 11]  # 22 is no stop id here: the runner-up until EOS may come
    assert len(outs[2].token_ids) == 5 and outs[2].token_ids[4] == 11 and not {11, 22} & set(outs[2].token_ids[:4])
    assert outs[3].token_ids == [11] * 10 and outs[3].finish_reason == "length"  # an ignored EOS is not suppressed
    assert len(outs[4].token_ids) == 6 and outs[4].token_ids[5] == 11 and not {11, 22} & set(outs[4].token_ids[:5])
    assert all(outs[i].finish_reason == "stop" for i in (0, 1, 2, 4))


def test_a_biased_stop_id_is_still_held_back_by_min_tokens(eos_forced):
    out = eos_forced().generate(
        [[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0, min_tokens=3, logit_bias={11: 100})
    )
    assert out[0].token_ids == [22, 22, 22, 11]


def test_seeded_penalized_sampling_does_not_depend_on_the_batch(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint)
    seeded = SamplingParams(max_tokens=16, temperature=0.8, seed=7, ignore_eos=True, min_p=0.05, **PENALIZED)
    alone = rt.generate([[4, 5, 6, 4, 5, 6]], seeded)[0].token_ids
    others = [
        SamplingParams(max_tokens=12, temperature=1.0, seed=1, ignore_eos=True, repetition_penalty=0.8),
        SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, frequency_penalty=-1.0),
        SamplingParams(max_tokens=9, temperature=0.7, top_k=20, seed=2, ignore_eos=True),
    ]
    mixed = rt.generate([[1, 2], [4, 5, 6, 4, 5, 6], [8] * 20, [3]], [others[0], seeded, others[1], others[2]])
    assert mixed[1].token_ids == alone


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_an_unpenalized_request_beside_a_penalized_one_is_unchanged(make_runtime, tiny_checkpoint, temperature):
    rt = make_runtime(tiny_checkpoint)
    plain = SamplingParams(max_tokens=12, temperature=temperature, seed=5, ignore_eos=True, logprobs=3)
    alone = rt.generate([[9, 9, 9, 2]], plain)[0]
    other = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=2)
    penalized = SamplingParams(**{**vars(other), **PENALIZED})
    # Against the same batch without penalties: a batch of two may round the model's logits unlike a batch of one.
    unpenalized, beside = (rt.generate([[9, 9, 9, 2]] * 2, [plain, p]) for p in (other, penalized))
    assert beside[0].token_ids == unpenalized[0].token_ids == alone.token_ids
    assert beside[0].logprobs == unpenalized[0].logprobs
    assert beside[1].token_ids != unpenalized[1].token_ids


def test_penalty_slots_are_held_while_running_and_freed_at_the_end(make_runtime, tiny_checkpoint):
    rt = make_runtime(tiny_checkpoint, engine__max_num_seqs=4)
    slots = rt.runner.tail.penalties
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, presence_penalty=1.0)
    doomed = rt.add_request([1, 2, 3], params)
    rt.add_request([4, 5], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))  # holds none
    kept = rt.add_request([6, 7], params)
    rt.step()  # the prefill: both penalized requests take a slot
    assert set(slots.held) == {doomed, kept} and len(slots.free) == 2
    rt.abort(doomed)
    assert set(slots.held) == {kept}
    while rt.has_unfinished():
        rt.step()
    assert slots.held == {} and sorted(slots.free) == [0, 1, 2, 3]
    rt.generate([[1, 2]] * 6, SamplingParams(max_tokens=5, temperature=0, min_tokens=2))  # more than the slots
    assert slots.held == {} and len(slots.free) == 4


def test_a_preempted_penalized_request_keeps_its_counts(make_runtime, tiny_checkpoint):
    """Recomputed after preemption, penalized requests produce the tokens they produce with room to spare."""
    prompts = [[i + 1] * (10 + 7 * i) for i in range(6)]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, **PENALIZED)
    reference = [o.token_ids for o in make_runtime(tiny_checkpoint).generate(prompts, params)]
    rt = make_runtime(tiny_checkpoint, engine__num_kv_blocks=10, engine__max_model_len=128)
    outs = rt.generate(prompts, params)
    assert rt.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == reference
    assert rt.runner.tail.penalties.held == {}


def test_a_slot_takes_the_requests_stop_ids_biases_and_prompt_exactly():
    """At Qwen3's vocabulary and the full bias table (1,024 entries, negative and inexact values among them): what
    acquire uploads in one copy lands in the slot's rows bit for bit."""
    from qwen3_runtime.params import MAX_LOGIT_BIAS, MAX_STOP_IDS
    from qwen3_runtime.penalty_slots import PenaltySlots
    from qwen3_runtime.request import Request

    vocab, g = 151_936, torch.Generator().manual_seed(0)
    slots = PenaltySlots.allocate(2, vocab, [151_645], torch.device("cpu"))
    tokens = torch.randperm(vocab, generator=g)[:MAX_LOGIT_BIAS].tolist()
    values = [-100.0, 100.0, 0.1, -0.0] + ((torch.rand(MAX_LOGIT_BIAS - 4, generator=g) - 0.5) * 200).tolist()
    prompt = [5, 17, 151_935, 5]
    params = SamplingParams(max_tokens=8, min_tokens=2, stop_token_ids=[9], logit_bias=dict(zip(tokens, values)))
    req = Request(0, prompt, params, seed=0)
    slots.acquire([req])
    slot, state = slots.slot(req), slots.state
    assert state.num_bias[slot] == MAX_LOGIT_BIAS and state.bias_ids[slot].tolist() == tokens
    assert torch.equal(state.bias_values[slot].view(torch.int32), torch.tensor(values).view(torch.int32))
    assert state.stop_ids[slot].tolist() == [9, 151_645] + [-1] * (MAX_STOP_IDS - 2)
    assert state.prompt_mask[slot].nonzero().flatten().tolist() == [5, 17, 151_935]
    assert not state.output_counts[slot].any()
