"""Structured outputs through the Runtime (CPU, the tiny random model with Qwen3's tokenizer): every token is
allowed by the grammar, the grammar's end stops the request, a constraint that does not compile rejects it alone,
and an unconstrained request beside a constrained one keeps its tokens. A constrained step stays in flight like any
other: its forward launches before the step in flight is read, its masks are filled after, from grammars that have
seen every earlier token. On CUDA (marked gpu): the masked steps' graphs."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from qwen3_runtime import SamplingParams
from qwen3_runtime.request import PENDING
from qwen3_runtime.structured import OutputConstraint

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["color", "n"],
}
SAMPLED = SamplingParams(max_tokens=60, temperature=1.0, seed=3)


@pytest.fixture
def rt(make_runtime):
    with make_runtime() as runtime:
        yield runtime


def text(rt, out) -> str:
    return rt.tokenizer.decode([t for t in out.token_ids if t not in rt.eos_token_ids])


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_outputs_match_their_constraint_and_stop_at_the_grammars_end(make_runtime, async_scheduling):
    constraints = [
        OutputConstraint.json_schema(SCHEMA),
        OutputConstraint.regex(r"[a-c]{2,4}-\d"),
        OutputConstraint.choice(["yes", "no", "maybe"]),
    ]
    with make_runtime(engine__async_scheduling=async_scheduling) as rt:
        params = [replace(SAMPLED, constraint=c, seed=i) for i, c in enumerate(constraints)]
        outs = rt.generate([[5, 6, 7]] * 3, params)
        assert [o.finish_reason for o in outs] == ["stop"] * 3
        value = json.loads(text(rt, outs[0]))
        assert value["color"] in ("red", "green") and 0 <= value["n"] <= 9 and set(value) == {"color", "n"}
        assert re.fullmatch(r"[a-c]{2,4}-\d", text(rt, outs[1]))
        assert text(rt, outs[2]) in ("yes", "no", "maybe")


def test_the_grammar_ends_the_request_even_with_ignore_eos(rt):
    out = rt.generate([[5, 6]], replace(SAMPLED, ignore_eos=True, constraint=OutputConstraint.choice(["a", "b"])))[0]
    assert out.finish_reason == "stop" and text(rt, out) in ("a", "b")


def test_max_tokens_mid_structure_ends_with_length(rt):
    out = rt.generate([[5, 6]], replace(SAMPLED, max_tokens=3, constraint=OutputConstraint.json_schema(SCHEMA)))[0]
    assert out.finish_reason == "length" and text(rt, out).startswith('{"')


def test_a_constraint_that_does_not_compile_rejects_its_request_alone(rt):
    bad = replace(SAMPLED, constraint=OutputConstraint.regex("(ab", field="response_format.regex"))
    outs = rt.generate([[5, 6], [5, 6]], [bad, SAMPLED])
    assert outs[0].finish_reason == "rejected" and outs[0].token_ids == []
    assert outs[0].error.startswith("response_format.regex=")
    assert outs[1].error is None and len(outs[1].token_ids) > 0


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_constrained_requests_leave_the_others_tokens_unchanged(make_runtime, async_scheduling):
    """One constraint ends after a few tokens, mid-batch; the other runs on beside the unconstrained rows."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 15]]
    short = replace(SAMPLED, constraint=OutputConstraint.choice(["yes", "no"]))
    long = replace(SAMPLED, constraint=OutputConstraint.json_schema(SCHEMA))
    with make_runtime(engine__async_scheduling=async_scheduling) as rt:
        alone = rt.generate(prompts[:2], SAMPLED)
        mixed = rt.generate(prompts, [SAMPLED, SAMPLED, short, long])
        assert [o.token_ids for o in mixed[:2]] == [o.token_ids for o in alone]
        assert mixed[2].finish_reason == "stop" and text(rt, mixed[2]) in ("yes", "no")
        assert len(mixed[2].token_ids) < len(mixed[3].token_ids) < len(mixed[0].token_ids)
        assert json.loads(text(rt, mixed[3]))["color"] in ("red", "green")


def test_tokens_are_the_same_with_async_scheduling_on_and_off(make_runtime):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = [
        replace(SAMPLED, constraint=OutputConstraint.json_schema(SCHEMA)),
        SAMPLED,
        replace(SAMPLED, seed=5, constraint=OutputConstraint.regex(r"[a-c]{2,12}-\d")),
    ]
    tokens = {}
    for async_scheduling in (True, False):
        with make_runtime(engine__async_scheduling=async_scheduling) as rt:
            tokens[async_scheduling] = [o.token_ids for o in rt.generate(prompts, params)]
    assert tokens[True] == tokens[False]


def test_the_constraint_applies_after_its_token(rt):
    think_end = 151668
    params = replace(SAMPLED, constraint=OutputConstraint.choice(["ok"]), constraint_after=think_end)
    out = rt.generate([[5, 6]], replace(params, max_tokens=20))[0]  # </think> never sampled: unconstrained
    assert out.finish_reason in ("length", "stop") and think_end not in out.token_ids


def test_raw_logprobs_are_the_models_and_processed_ones_the_masked(rt):
    choice = OutputConstraint.choice(["yes", "no"])

    def allowed(token: int) -> bool:  # a first token of "yes" or "no", however tokenized
        piece = rt.tokenizer.token_bytes(token)
        return bool(piece) and (b"yes".startswith(piece) or b"no".startswith(piece))

    base = replace(SAMPLED, max_tokens=1, logprobs=5, temperature=0)
    raw, processed = rt.generate(
        [[5, 6], [5, 6]],
        [replace(base, constraint=choice), replace(base, constraint=choice, logprobs_mode="processed")],
    )
    free = rt.generate([[5, 6]], base)[0]
    assert raw.token_ids == processed.token_ids and allowed(raw.token_ids[0])
    assert raw.logprobs[0].top_ids == free.logprobs[0].top_ids
    finite = {t for t, lp in zip(processed.logprobs[0].top_ids, processed.logprobs[0].top_logprobs) if lp > -1e30}
    assert finite and all(allowed(t) for t in finite) and raw.logprobs[0].top_ids != processed.logprobs[0].top_ids


def test_a_constrained_step_stays_in_flight_with_one_copy_and_one_wait(rt):
    rt.add_request([5, 6], replace(SAMPLED, constraint=OutputConstraint.regex("[a-z]{12}")))
    rt.add_request([7, 8], SAMPLED)
    steps = 0
    while rt.has_unfinished():
        rt.step()
        steps += 1
        constrained = rt._in_flight is not None and any(req.constrained for req in rt._in_flight.reqs)
        assert constrained or not rt.scheduler.running or not any(req.constrained for req in rt.scheduler.running)
    assert rt.stats.decode_steps + rt.stats.prefill_steps == rt.stats.d2h_copies == rt.stats.host_syncs < steps


def test_the_masks_are_filled_after_the_forward_launches_from_every_earlier_token(rt, monkeypatch):
    """The order within a step: the masked step's forward, the step in flight read (its tokens accepted by the
    grammars), the masks filled from them, the masked tail."""
    events = []
    run, process, stage = rt.runner.graphs.run, rt._process, rt.runner.tail.grammar.stage

    def run_graph(rows, key):
        events.append("forward" if key.tail is None else "tail" if key.tail.masked else "step")
        return run(rows, key)

    def stage_masks(reqs, produced, padded_rows):
        events.append("masks")
        for req, slot in zip(reqs, produced):  # every token before the row's is known: the grammar has it
            assert PENDING not in req.output[:slot]
        stage(reqs, produced, padded_rows)

    monkeypatch.setattr(rt.runner.graphs, "run", run_graph)
    monkeypatch.setattr(rt, "_process", lambda step: events.append("read") or process(step))
    monkeypatch.setattr(rt.runner.tail.grammar, "stage", stage_masks)
    out = rt.generate([[5, 6]], replace(SAMPLED, constraint=OutputConstraint.regex(r"\d{12}")))[0]  # a token a digit
    assert re.fullmatch(r"\d{12}", text(rt, out)) and len(out.token_ids) == 13
    decode_steps = " ".join(events).split("read masks ")  # a prefill's tail runs eagerly: no "tail" event
    # The prefill's digit, 11 decode steps' and the end's, and one more step launched before the end was read
    assert sum(step.startswith("tail forward") for step in decode_steps) == 12
    assert "forward masks" not in " ".join(events) and "step" not in events


def test_a_request_aborted_while_constrained_ends_alone(rt):
    """Aborted with its row in flight: its tokens so far (a prefix of the grammar's language), the others' as
    without it."""
    alone = rt.generate([[8, 9]], SAMPLED)[0]
    aborted = rt.add_request([5, 6], replace(SAMPLED, constraint=OutputConstraint.regex("[a-c]{20,40}")))
    other = rt.add_request([8, 9], SAMPLED)
    outs = {}
    while len([t for t in rt._live[aborted].output if t != PENDING]) < 4:
        outs |= {o.request_id: o for o in rt.step()}
    assert any(req.request_id == aborted for req in rt._in_flight.reqs)
    rt.abort(aborted)
    while rt.has_unfinished():
        outs |= {o.request_id: o for o in rt.step()}
    assert outs[aborted].finish_reason == "abort" and outs[aborted].error is None
    assert re.fullmatch("[a-c]+", text(rt, outs[aborted])) and len(outs[aborted].token_ids) >= 4
    assert outs[other].token_ids == alone.token_ids


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_min_tokens_holds_the_end_back_until_it_is_all_the_grammar_allows(make_runtime, async_scheduling):
    """EOS biased up, so each request ends as soon as it may: a grammar that may go on ends at min_tokens; one whose
    only way on is its end ends there, short of min_tokens, with "stop" (not failed for a row with nothing left)."""
    end = 151645
    base = replace(SAMPLED, logit_bias={end: 100.0}, min_tokens=6)
    letters = replace(base, constraint=OutputConstraint.regex("[a-c]+"))
    choice = replace(base, constraint=OutputConstraint.choice(["yes", "no"]))
    with make_runtime(engine__async_scheduling=async_scheduling) as rt:
        held, short = rt.generate([[5, 6, 7], [8, 9]], [letters, choice])
        free = rt.generate([[5, 6, 7]], replace(letters, min_tokens=0))[0]
        assert (held.finish_reason, held.error, len(held.token_ids), held.token_ids[-1]) == ("stop", None, 7, end)
        assert re.fullmatch("[a-c]+", text(rt, held)) and len(free.token_ids) == 2  # one letter, then the end
        assert (short.finish_reason, short.error, short.token_ids[-1]) == ("stop", None, end)
        assert text(rt, short) in ("yes", "no") and len(short.token_ids) < 6


def _ordered_run(rt, constrained: SamplingParams, plain: SamplingParams):
    """A constrained and a plain request prefilled in one step (the grammar compiled first), then decoded together."""
    cid = rt.add_request([5, 6, 7], constrained)
    rt._live[cid].grammar.result()
    pid = rt.add_request([8, 9], plain)
    outs = {}
    while rt.has_unfinished():
        outs |= {o.request_id: o for o in rt.step()}
    return outs[cid], outs[pid]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_constrained_steps_through_the_masked_graphs_on_cuda():
    """The tiny config on CUDA: the masked steps' graphs (the forward, then the masked tail) are captured at the
    first constrained decode step, the prefill before it in flight; every output parses against its schema. The
    same run again, on the graphs captured, gives the same tokens: the capture left the step in flight intact."""
    from qwen3_runtime import Runtime

    overrides = {"engine.device": "cuda", "model.dtype": "bfloat16", "engine.max_num_seqs": 8}
    constrained = replace(SAMPLED, constraint=OutputConstraint.json_schema(SCHEMA))
    plain = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    with Runtime.from_yaml("tiny", overrides=overrides) as rt:
        assert not any(key.split for _, key in rt.runner.graphs.graphs)
        first = _ordered_run(rt, constrained, plain)
        assert any(key.tail is None for _, key in rt.runner.graphs.graphs)
        again = _ordered_run(rt, constrained, plain)
        assert [o.token_ids for o in first] == [o.token_ids for o in again]
        for out in (first[0], again[0]):
            value = json.loads(text(rt, out))
            assert out.finish_reason == "stop" and set(value) == {"color", "n"} and 0 <= value["n"] <= 9
        outs = rt.generate([[5, 6]] * 6, [replace(constrained, seed=i) for i in range(6)])
        assert all(json.loads(text(rt, o))["color"] in ("red", "green") for o in outs)
        rt.step()  # the step still in flight (async scheduling), read
        steps = rt.stats.decode_steps + rt.stats.prefill_steps
        assert rt.stats.d2h_copies == rt.stats.host_syncs == steps
