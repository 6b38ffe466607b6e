"""What tool_choice demands of the answer, as the constraint the grammar enforces: where it is carried (the chat
request's engine inputs' params) and what it says for each tool_choice."""

import pytest

from qwen3_runtime.params import RequestLimits
from qwen3_runtime.server.inputs import InputContext, chat_inputs
from qwen3_runtime.server.protocol import ChatCompletionRequest
from qwen3_runtime.server.tool_constraint import NO_PARAMETERS, FunctionSchema, ToolConstraint, tool_constraint
from qwen3_runtime.tokenizer import Tokenizer

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "now"}},
]


@pytest.fixture(scope="module")
def ctx():
    return InputContext(Tokenizer.builtin_qwen3(), RequestLimits(151936, 4096, 5), {})


def constraints(ctx, n=1, **fields):
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, n=n, **fields)
    demanded = tool_constraint(req.tools, req.tool_choice, req.parallel_tool_calls)
    sent = [x.params.constraint for x in chat_inputs(req, ctx)]
    assert sent == [demanded and demanded.output_constraint()] * n  # what the engine enforces
    return [demanded] * n


def test_auto_and_none_demand_nothing(ctx):
    assert constraints(ctx) == constraints(ctx, tool_choice="auto") == constraints(ctx, tool_choice="none") == [None]


def test_required_allows_every_function(ctx):
    (many,) = constraints(ctx, tool_choice="required")
    assert many == ToolConstraint((FunctionSchema("weather", CITY), FunctionSchema("now", NO_PARAMETERS)), False)
    (one,) = constraints(ctx, tool_choice="required", parallel_tool_calls=False)
    assert one.exactly_one and (one.begin, one.end) == ("<tool_call>\n", "\n</tool_call>")


def test_a_named_function_is_one_call_of_it(ctx):
    named = constraints(ctx, n=2, tool_choice={"type": "function", "function": {"name": "weather"}})
    assert named[0].functions == (FunctionSchema("weather", CITY),) and named[0].exactly_one


def test_the_call_schema_names_each_function_with_its_parameters(ctx):
    (required,) = constraints(ctx, tool_choice="required")
    weather, now = required.call_schema()["anyOf"]
    assert weather == {
        "type": "object",
        "properties": {"name": {"const": "weather"}, "arguments": CITY},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    assert now["properties"] == {"name": {"const": "now"}, "arguments": NO_PARAMETERS}
