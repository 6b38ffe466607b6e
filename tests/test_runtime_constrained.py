"""Structured outputs through the Runtime (CPU, the tiny random model with Qwen3's tokenizer): every token is
allowed by the grammar, the grammar's end stops the request, a constraint that does not compile rejects it alone,
and an unconstrained request beside a constrained one keeps its tokens."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from qwen3_runtime import SamplingParams
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


def test_a_constrained_request_leaves_the_others_tokens_unchanged(rt):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    alone = rt.generate(prompts[:2], SAMPLED)
    constrained = replace(SAMPLED, constraint=OutputConstraint.json_schema(SCHEMA))
    mixed = rt.generate(prompts, [SAMPLED, SAMPLED, constrained])
    assert [o.token_ids for o in mixed[:2]] == [o.token_ids for o in alone]


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


def test_only_steps_with_a_constrained_row_are_read_before_the_next_launches(rt):
    rt.add_request([5, 6], replace(SAMPLED, max_tokens=8))
    rt.step()
    assert rt._in_flight is not None  # unconstrained: async
    rt.add_request([5, 6], replace(SAMPLED, constraint=OutputConstraint.regex("[a-z]{8}")))
    while not any(req.constrained for req in rt.scheduler.running):
        rt.step()  # the grammar compiles meanwhile; the step admitting it is read at once
        assert rt._in_flight is None or not any(r.constrained for r in rt._in_flight.reqs)
    rt.step()
    assert rt._in_flight is None
