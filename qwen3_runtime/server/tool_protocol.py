"""OpenAI's `tools` and `tool_choice` in a chat request (pydantic), and the checks between them: a 400 naming the
field for a tool_choice that names no function of `tools`, or asks for a call with no tools to call."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from qwen3_runtime.server.errors import refused


class FunctionDefinition(BaseModel):
    # OpenAI's rule for a function's name: what a grammar and a client can always spell back.
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class ChatTool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: that function must be called."""

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def check_tools(tools: list[ChatTool] | None, tool_choice: ToolChoice | None) -> None:
    """Names unique among tools; a call asked for (required, or named) needs tools, a named one among them."""
    names = [tool.function.name for tool in tools or ()]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise refused(f"tools[{i}].function.name", f"tools[{i}].function.name {name!r} is given twice")
    if tool_choice == "required" and not names:
        raise refused("tool_choice", 'tool_choice "required" needs tools: there is no function to call')
    if isinstance(tool_choice, NamedToolChoice) and tool_choice.function.name not in names:
        name = tool_choice.function.name
        raise refused("tool_choice", f"tool_choice names function {name!r}, which is not in tools")
