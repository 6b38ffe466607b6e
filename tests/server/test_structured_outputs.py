"""Structured outputs through a real server (the tiny random model, `--reasoning-parser qwen3 --tool-call-parser
hermes`) and the official openai client: every constrained answer parses and validates, whatever field asked for it;
bad constraints are a 400 naming the field. Schemas bound their strings (maxLength, enums): a random model rarely
closes an unbounded one."""

import json
import re
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

pytest.importorskip("xgrammar")

HI = [{"role": "user", "content": "Hi"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}  # the answer from the first token
THINK, END = 151667, 151668
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "now"}},
]


class Pick(BaseModel):
    color: Literal["red", "green", "blue"]
    count: int = Field(ge=0, le=9)


@pytest.fixture(scope="module")
def client(launch_server):
    url = launch_server("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes")[1]
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, **fields):
    extra = {**NO_THINKING, **fields.pop("extra_body", {})}
    fields.setdefault("max_tokens", 120)
    return client.chat.completions.create(model="tiny", messages=HI, seed=1, extra_body=extra, **fields).choices[0]


def test_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(
        model="tiny", messages=HI, response_format=Pick, max_tokens=120, seed=2, extra_body=NO_THINKING
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Pick)


def test_json_object_and_schema_on_chat_and_completions(client):
    any_object = chat(client, response_format={"type": "json_object"}, max_tokens=200)  # strings unbounded
    assert any_object.finish_reason == "length" or isinstance(json.loads(any_object.message.content), dict)
    schema = Pick.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}
    Pick.model_validate_json(chat(client, response_format=fmt).message.content)
    done = client.completions.create(
        model="tiny", prompt="Hi", max_tokens=120, seed=3, extra_body={"guided_json": schema}
    )
    assert done.choices[0].finish_reason == "stop"
    Pick.model_validate_json(done.choices[0].text)


def test_regex_and_choice_old_and_new_names(client):
    for body in ({"structured_outputs": {"regex": r"[a-c]{2,4}-\d"}}, {"guided_regex": r"[a-c]{2,4}-\d"}):
        assert re.fullmatch(r"[a-c]{2,4}-\d", chat(client, extra_body=body).message.content)
    for body in ({"structured_outputs": {"choice": ["yes", "no"]}}, {"guided_choice": ["yes", "no"]}):
        assert chat(client, extra_body=body).message.content in ("yes", "no")


def test_the_constraint_holds_after_the_thinking(client):
    bias = {str(THINK): 100, str(END): 80}  # think, close it at once; then the answer is constrained
    choice = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=40, temperature=0, logit_bias=bias,
        extra_body={"repetition_penalty": 10, "guided_choice": ["yes", "no"]},
    ).choices[0]  # fmt: skip
    assert choice.message.content in ("yes", "no") and choice.finish_reason == "stop"


def check_calls(calls: list[tuple[str, str]], names: set[str]) -> None:
    """Each (name, arguments) names a tool of `names`, its arguments valid for its parameters."""
    assert calls and all(name in names for name, _ in calls)
    for name, arguments in calls:
        args = json.loads(arguments)
        if name == "weather":
            assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 6
        else:
            assert args == {}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "weather"}}], ids=["required", "named"]
)
def test_tool_calls_are_enforced(client, tool_choice, stream):
    # max_tokens unset: what the 256-token context leaves after the tools; one call, so the answer ends well within.
    fields = dict(model="tiny", messages=HI, tools=TOOLS, tool_choice=tool_choice, seed=4, parallel_tool_calls=False)
    fields["extra_body"] = NO_THINKING
    names = {"weather", "now"} if tool_choice == "required" else {"weather"}
    if not stream:
        choice = client.chat.completions.create(**fields).choices[0]
        check_calls([(c.function.name, c.function.arguments) for c in choice.message.tool_calls], names)
        assert choice.finish_reason == ("tool_calls" if tool_choice == "required" else choice.finish_reason)
        return
    calls: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(stream=True, **fields):
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += (call.function.name or "") if call.function else ""
            entry[1] += (call.function.arguments or "") if call.function else ""
    check_calls([(name, arguments) for name, arguments in calls.values()], names)


def test_max_tokens_mid_structure_ends_with_length(client):
    choice = chat(client, response_format={"type": "json_object"}, max_tokens=2)
    assert choice.finish_reason == "length" and choice.message.content.startswith("{")


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
         "response_format", "response_format.json_schema.schema"),
        ({"extra_body": {"structured_outputs": {"regex": "(ab"}}}, "structured_outputs", "structured_outputs.regex"),
        ({"extra_body": {"guided_regex": "a", "guided_choice": ["b"]}}, "guided_choice", "guided_regex and guided_"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ],
    ids=["schema", "regex", "two", "unknown-tool"],
)  # fmt: skip
def test_bad_constraints_are_a_400_naming_the_field(client, body, param, says):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, **body)
    assert e.value.body["param"].startswith(param) and says in e.value.body["message"]
