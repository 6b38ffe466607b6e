"""OutputConstraint: plain data, equal by value (the compile cache's key), every bad value a ValueError naming the
request field it came from."""

import json
import pickle

import pytest

from qwen3_runtime.structured.spec import (
    GrammarCompileError,
    InvalidConstraintError,
    OutputConstraint,
    StructuredOutputError,
)

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string", "maxLength": 4}}}


def test_a_schema_as_object_or_text_is_one_constraint_in_its_key_order():
    from_object = OutputConstraint.json_schema(SCHEMA)
    from_text = OutputConstraint.json_schema(json.dumps(SCHEMA, indent=2), field="guided_json")
    assert from_object == from_text and hash(from_object) == hash(from_text)  # the field is not part of it
    assert from_object.kind == "json" and from_object.field == "structured_outputs.json"
    assert from_text.field == "guided_json"
    assert list(json.loads(from_object.text)["properties"]) == ["b", "a"]  # generated in this order
    assert OutputConstraint.json_schema({"a": "é"}).text == '{"a":"é"}'


def test_each_kind():
    assert OutputConstraint.json_object() == OutputConstraint("json_object")
    assert OutputConstraint.regex(r"\d+").text == r"\d+"
    assert OutputConstraint.choice(["yes", "no"]).choices == ("yes", "no")
    assert OutputConstraint.choice(["yes", "no"]) != OutputConstraint.choice(["no", "yes"])
    assert OutputConstraint.grammar('root ::= "a"').kind == "grammar"
    assert len({OutputConstraint.regex("a"), OutputConstraint.grammar("a"), OutputConstraint.regex("a")}) == 2


@pytest.mark.parametrize(
    "make, field, says",
    [
        (lambda f: OutputConstraint.json_schema("{not json", field=f), "guided_json", "not JSON"),
        (lambda f: OutputConstraint.json_schema("[1, 2]", field=f), "guided_json", "a JSON object"),
        (lambda f: OutputConstraint.json_schema([1, 2], field=f), "guided_json", "a JSON object"),
        (lambda f: OutputConstraint.json_schema('{"maximum": NaN}', field=f), "guided_json", "NaN is not a JSON"),
        (lambda f: OutputConstraint.json_schema({"maximum": float("inf")}, field=f), "guided_json", "not JSON"),
        (lambda f: OutputConstraint.json_schema({"a": {1, 2}}, field=f), "guided_json", "not JSON"),
        (lambda f: OutputConstraint.regex("", field=f), "guided_regex", "non-empty string"),
        (lambda f: OutputConstraint.regex(3, field=f), "guided_regex", "non-empty string"),
        (lambda f: OutputConstraint.grammar("", field=f), "structured_outputs.grammar", "non-empty string"),
        (lambda f: OutputConstraint.choice([], field=f), "guided_choice", "non-empty list"),
        (lambda f: OutputConstraint.choice("yes", field=f), "guided_choice", "a list of strings"),
        (lambda f: OutputConstraint.choice(["a", ""], field=f), "guided_choice", "choice 1 ('')"),
        (lambda f: OutputConstraint.choice(["a", 2], field=f), "guided_choice", "choice 1 (2)"),
        (lambda f: OutputConstraint("xml", "<a/>", field=f), "structured_outputs", "expected one of json, "),
        (lambda f: OutputConstraint("json_object", "{}", field=f), "response_format", "has no text"),
        (lambda f: OutputConstraint("regex", "a", ("a",), field=f), "guided_regex", "has no choices"),
        (lambda f: OutputConstraint("json", '"a"', field=f), "response_format.json_schema", "a JSON object"),
    ],
)
def test_a_bad_value_is_a_value_error_naming_its_field(make, field, says):
    with pytest.raises(InvalidConstraintError) as caught:
        make(field)
    assert isinstance(caught.value, ValueError) and caught.value.field == field
    assert str(caught.value).startswith(f"{field}=") and says in str(caught.value), str(caught.value)


def test_errors_and_constraints_cross_a_process_boundary():
    """The engine process sends a compile error back to the API process; requests carry their constraint."""
    error = GrammarCompileError("guided_regex='(a' is invalid: xgrammar: not closed", "guided_regex")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is GrammarCompileError and isinstance(copy, StructuredOutputError)
    assert (str(copy), copy.field) == (str(error), "guided_regex")
    constraint = OutputConstraint.choice(["a", "b"], field="guided_choice")
    assert pickle.loads(pickle.dumps(constraint)).field == "guided_choice"
