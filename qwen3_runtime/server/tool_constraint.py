"""What a chat request's tool_choice demands of the answer, as the output constraint the engine's grammar enforces
(issue 71's structured outputs): `required` asks for at least one call (exactly one with parallel_tool_calls false), a
named function for one call of it. "auto" and "none" demand nothing. The calls are the ones Qwen3's chat template
asks for and `--tool-call-parser hermes` reads: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
with "\\n" between calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qwen3_runtime.server.tool_parser import CLOSE_TAG, OPEN_TAG
from qwen3_runtime.server.tool_protocol import ChatTool, NamedToolChoice, ToolChoice
from qwen3_runtime.structured import OutputConstraint

NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI's meaning of a function without `parameters`


@dataclass(frozen=True)
class FunctionSchema:
    name: str
    parameters: dict[str, Any]  # the JSON schema of its arguments object


@dataclass(frozen=True)
class ToolConstraint:
    functions: tuple[FunctionSchema, ...]  # the functions a call may name
    exactly_one: bool  # one call; else one or more
    begin: str = OPEN_TAG + "\n"  # what each call's JSON stands between
    end: str = "\n" + CLOSE_TAG

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema of one call's object: the name first (as the template writes it), then arguments that
        validate against that function's parameters."""
        return {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for f in self.functions
            ]
        }

    def output_constraint(self) -> OutputConstraint:
        """What the engine compiles (spec.py's tool_call / tool_calls), naming tool_choice in its errors."""
        return OutputConstraint.tool_calls(self.call_schema(), (self.begin, self.end), self.exactly_one, "tool_choice")


def tool_constraint(
    tools: list[ChatTool] | None, tool_choice: ToolChoice | None, parallel_tool_calls: bool | None
) -> ToolConstraint | None:
    """None unless tool_choice asks for a call (the request was checked: a named function is among tools)."""
    functions = tuple(FunctionSchema(t.function.name, t.function.parameters or NO_PARAMETERS) for t in tools or ())
    if isinstance(tool_choice, NamedToolChoice):
        return ToolConstraint(tuple(f for f in functions if f.name == tool_choice.function.name), exactly_one=True)
    if tool_choice == "required":
        return ToolConstraint(functions, exactly_one=parallel_tool_calls is False)
    return None
