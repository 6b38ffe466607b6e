"""ConstraintMatcher and HostBitmask with Qwen3's real tokenizer: valid outputs, tokenized as the model would emit
them, pass token by token; invalid tokens are refused; the reasoning gate; the padded vocabulary never allowed."""

import json

import numpy as np
import pytest

pytest.importorskip("xgrammar")

from qwen3_runtime.structured.matcher import ALL_ONES, ConstraintMatcher, HostBitmask, bitmask_width  # noqa: E402
from qwen3_runtime.structured.spec import OutputConstraint  # noqa: E402
from tests.structured.conftest import EOS, THINK_END, VOCAB, WIDTH, allowed, allowed_ids, drive  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "color"],
}
BOB = {"name": "Bob Ó'Brien", "age": 42, "color": "green", "tags": ["a b", "ü"]}


def matcher_for(compiler, constraint: OutputConstraint, **kw) -> ConstraintMatcher:
    return ConstraintMatcher(compiler.compile(constraint), **kw)


def finish(matcher: ConstraintMatcher) -> None:
    """At a whole match only the stop tokens are allowed; one ends the grammar, whose row is then all zeros."""
    assert set(allowed(matcher)) == set(EOS)
    assert matcher.accept(EOS[0]) and matcher.terminated
    assert not matcher.accept(EOS[0]) and not matcher.accept(90)
    assert len(allowed(matcher)) == 0


def test_a_valid_json_instance_passes_and_ends(compiler, tok):
    matcher = matcher_for(compiler, OutputConstraint.json_schema(PERSON))
    drive(matcher, tok.encode(json.dumps(BOB, ensure_ascii=False, separators=(", ", ": "))))
    finish(matcher)


@pytest.mark.parametrize(
    "prefix, bad",
    [
        ("", "["),  # not an object
        ('{"name": "', "Bob Bob Bob Bob"),  # past maxLength 12
        ('{"name": "B", "age": ', "-"),  # below the minimum
        ('{"name": "B", "age": 15', "1"),  # above the maximum
        ('{"name": "B", "age": 1, "color": "', "pink"),  # not in the enum
        ('{"name": "B", "age": 1, "color": "red"', ', "extra'),  # strict: no property the schema does not name
        ('{"name": "B"', "}"),  # age and color are required
    ],
)
def test_invalid_tokens_are_refused_and_leave_the_state(compiler, tok, prefix, bad):
    matcher = matcher_for(compiler, OutputConstraint.json_schema(PERSON))
    drive(matcher, tok.encode(prefix))
    before = allowed(matcher)
    ids = tok.encode(bad)
    for i in ids[:-1]:
        if not matcher.accept(i):
            break
    else:
        assert not matcher.accept(ids[-1])
    if len(ids) == 1:
        assert ids[0] not in before and np.array_equal(allowed(matcher), before)


def test_json_object_takes_any_object(compiler, tok):
    matcher = matcher_for(compiler, OutputConstraint.json_object())
    assert set(allowed(matcher)) == {90, 4913, 6257}  # "{", '{"' and "{}"
    drive(matcher, tok.encode('{"a": [1, -2.5e3, true, null], "b": {"c": "d\\n"}}'))
    finish(matcher)


def test_regex(compiler, tok):
    constraint = OutputConstraint.regex(r"[A-Z][a-z]{1,8}-\d{3}")
    matcher = matcher_for(compiler, constraint)
    drive(matcher, tok.encode("Hello-123"))
    finish(matcher)
    matcher = matcher_for(compiler, constraint)
    assert not matcher.accept(tok.encode("hello")[0])  # lower case first
    drive(matcher, tok.encode("Hi-12"))
    assert not matcher.accept(tok.encode("x")[0])


def test_choice(compiler, tok):
    constraint = OutputConstraint.choice(["positive", "negative", "neutral"])
    for choice in constraint.choices:
        matcher = matcher_for(compiler, constraint)
        drive(matcher, tok.encode(choice))
        finish(matcher)
    assert not matcher_for(compiler, constraint).accept(tok.encode("maybe")[0])


def test_an_ebnf_grammar(compiler, tok):
    grammar = 'root ::= "SELECT " column (", " column)* " FROM t;"\ncolumn ::= [a-z]+'
    matcher = matcher_for(compiler, OutputConstraint.grammar(grammar))
    drive(matcher, tok.encode("SELECT a, bc FROM t;"))
    finish(matcher)
    matcher = matcher_for(compiler, OutputConstraint.grammar(grammar))
    drive(matcher, tok.encode("SELECT a"))
    assert not matcher.accept(tok.encode(" WHERE")[0])


def test_the_padded_vocabulary_and_special_tokens_are_never_allowed(compiler, tok):
    """Ids past the tokenizer (151,669 .. 151,935) have no text; special tokens produce none either."""
    specials = np.array(sorted(tok.special_ids - set(EOS)))
    matcher = matcher_for(compiler, OutputConstraint.regex(r"(.|\n)*"))  # any text at all
    for text in ("", "abc", "<|im_start|>"):
        drive(matcher, tok.encode(text, add_special_tokens=False) if "|" not in text else [])
        ids = allowed(matcher)
        assert len(ids) > 150_000 and ids[-1] < tok.vocab_size and not np.isin(specials, ids).any()
        assert np.isin(EOS, ids).all() and 151667 in ids  # <think> is text, kept as detokenizing shows it


def test_the_reasoning_gate(compiler, tok):
    """With a reasoning parser the grammar holds from </think> on: before it every token, and nothing advances."""
    constraint = OutputConstraint.json_schema(PERSON)
    matcher = matcher_for(compiler, constraint, activate_after=THINK_END)
    ungated = matcher_for(compiler, constraint)
    for i in [151667, *tok.encode("Let me think: [1, 2] is not an object.\n"), *EOS]:  # even a stop id
        assert not matcher.active and len(allowed(matcher)) == VOCAB
        assert matcher.accept(i)
    assert matcher.accept(THINK_END) and matcher.active
    assert np.array_equal(allowed(matcher), allowed(ungated))
    assert not matcher.accept(tok.encode("\n\n")[0])  # the answer starts at once
    drive(matcher, tok.encode(json.dumps(BOB, ensure_ascii=False, separators=(", ", ": "))))
    finish(matcher)


def test_the_host_bitmask_fills_many_rows_as_one_by_one(compiler, tok):
    bitmask = HostBitmask.allocate(8, VOCAB, threads=2)
    assert bitmask.array.shape == (8, WIDTH) == (8, bitmask_width(VOCAB)) and (bitmask.array == ALL_ONES).all()
    assert bitmask.array.ctypes.data == bitmask.tensor.data_ptr()  # one buffer: the tensor is what gets copied
    assert bitmask_width(VOCAB + 1) == WIDTH + 1
    schema, regex = OutputConstraint.json_schema(PERSON), OutputConstraint.regex(r"\d+(\.\d+)?")
    live = [matcher_for(compiler, schema), matcher_for(compiler, regex), matcher_for(compiler, schema)]
    drive(live[0], tok.encode('{"name": "Al'))
    drive(live[1], tok.encode("3.1"))
    gated = matcher_for(compiler, schema, activate_after=THINK_END)
    ended = matcher_for(compiler, regex)
    drive(ended, [*tok.encode("7"), EOS[0]])
    rows, matchers = [6, 0, 3, 5, 1], [live[0], live[1], gated, ended, live[2]]
    bitmask.array[:] = 12345  # junk: every filled row must be written whole
    bitmask.fill(rows, matchers)
    for row, matcher in zip(rows, matchers):
        expected = np.zeros((1, WIDTH), dtype=np.int32)
        matcher.fill(expected, 0)
        assert np.array_equal(bitmask.array[row], expected[0]), row
    assert (bitmask.array[3] == ALL_ONES).all() and (bitmask.array[5] == 0).all()
    assert (bitmask.array[[2, 4, 7]] == 12345).all()  # rows not asked for are left alone
    bitmask.fill([4], [live[1]])  # one live row: xgrammar's single fill
    assert np.array_equal(allowed_ids(bitmask.array[4]), allowed(live[1]))
    bitmask.fill_all_ones([2, 7])
    bitmask.fill_all_ones(slice(0, 1))
    assert (bitmask.array[[0, 2, 7]] == ALL_ONES).all() and (bitmask.array[4] != ALL_ONES).any()
    assert (bitmask.tensor[2] == -1).all()


def test_hold_end_bans_the_stop_ids_unless_they_are_all_the_grammar_allows(compiler, tok):
    """min_tokens through the mask: where the grammar may go on, its stop ids go; where it can only end, they stay
    (the grammar's end, which banning would turn into an empty row). Ids past bit 30 of a word included."""
    bitmask = HostBitmask.allocate(3, VOCAB, threads=2)
    going_on = matcher_for(compiler, OutputConstraint.regex(r"[a-c]+"))
    drive(going_on, tok.encode("ab"))
    ending = matcher_for(compiler, OutputConstraint.choice(["yes"]))
    drive(ending, tok.encode("yes"))
    bitmask.fill([0, 1], [going_on, ending])
    stops = [*EOS, 31, 63]  # 31 and 63: the sign bit of words 0 and 1
    bitmask.hold_end(0, stops)
    bitmask.hold_end(1, stops)
    bitmask.hold_end(2, stops)  # an unconstrained (all ones) row
    assert set(allowed(going_on)) & set(EOS) and not set(allowed_ids(bitmask.array[0])) & set(stops)
    assert set(allowed_ids(bitmask.array[0])) == set(allowed(going_on)) - set(EOS)
    assert set(allowed_ids(bitmask.array[1])) == set(EOS) == set(allowed(ending))
    assert set(range(VOCAB)) - set(allowed_ids(bitmask.array[2])) == set(stops)
