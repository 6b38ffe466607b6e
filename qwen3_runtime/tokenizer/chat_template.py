"""Chat templates: Jinja2 rendering as transformers does it, and Qwen3's template for the built-in tokenizer.

Checkpoints carry their chat template as Jinja2 source written for transformers' renderer, so
we render it the same way: a sandboxed environment (templates are untrusted input), trim_blocks and
lstrip_blocks, the loopcontrols extension, and the helpers templates call (`raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII text as is).
"""

from __future__ import annotations

import importlib.resources
import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from qwen3_runtime.input_errors import ChatTemplateError

# Qwen3's own chat template, verbatim (the `chat_template` of Qwen3's tokenizer_config.json), so the built-in
# tokenizer renders a conversation as a Qwen3 checkpoint does: earlier turns' reasoning stripped, tools, tool calls
# and tool results, and `enable_thinking=False`'s empty think block.
QWEN3_CHAT_TEMPLATE = (importlib.resources.files(__package__) / "qwen3_chat_template.jinja").read_text(encoding="utf-8")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes HTML characters and ASCII-encodes; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per source: a syntax error surfaces at load time, not on the first request."""
    return _environment().from_string(source)


def render(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool, **context: Any) -> str:
    """Render `source` with the variables transformers passes (messages, tools, documents, ...)."""
    for i, message in enumerate(messages):
        # Qwen3's template skips a message it cannot place; one without a role is a malformed input, not that.
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            raise ChatTemplateError(f"prompt[{i}]: every message needs a string role")
    context.setdefault("tools", None)
    context.setdefault("documents", None)
    try:
        return compile_template(source).render(
            messages=joined_text_parts(messages), add_generation_prompt=add_generation_prompt, **context
        )
    except ChatTemplateError:
        raise
    # A message of the wrong shape fails inside the template's own expressions (Qwen3's `content + '\n\n'` on a
    # number is a TypeError): a ValueError naming it, so Runtime.generate reports that prompt and serves the rest.
    except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as e:
        raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e


def joined_text_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose content is a list of OpenAI content parts get their text parts joined with newlines, as vLLM
    renders them: Qwen3's template reads string content only (a list renders as nothing). A part that is not text
    is a ChatTemplateError naming it: this model reads nothing else. Assistant tool calls get their arguments
    parsed (_parsed_arguments)."""
    joined = []
    for i, message in enumerate(messages):
        parts = message.get("content") if isinstance(message, dict) else None
        if isinstance(parts, list):
            for j, part in enumerate(parts):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ChatTemplateError(
                        f"prompt[{i}].content[{j}]={part!r} is not supported: only text parts "
                        "({'type': 'text', 'text': ...}) are"
                    )
            message = {**message, "content": "\n".join(part["text"] for part in parts)}
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list) and message.get("role") == "assistant":
            calls = [_parsed_arguments(call, f"prompt[{i}].tool_calls[{j}]") for j, call in enumerate(calls)]
            message = {**message, "tool_calls": calls}
        joined.append(message)
    return joined


def _parsed_arguments(call: Any, where: str) -> Any:
    """A tool call whose arguments (a JSON string in OpenAI's format) are the object they encode, as vLLM hands
    them to the template: Qwen3's renders them with tojson, so a compact string must not reach it verbatim."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or isinstance(function.get("arguments"), (dict, list)):
        return call
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if arguments else {}  # none or "" is no arguments, as vLLM takes it
    except (TypeError, json.JSONDecodeError) as e:
        raise ChatTemplateError(f"{where}.function.arguments={arguments!r:.60} is not valid JSON: {e}") from None
    return {**call, "function": {**function, "arguments": parsed}}
