"""Chat templates: Jinja2 rendering as transformers does it, and the built-in ChatML template.

Checkpoints carry their chat template as Jinja2 source written for transformers' renderer, so
we render it the same way: a sandboxed environment (templates are untrusted input), trim_blocks and
lstrip_blocks, the loopcontrols extension, and the helpers templates call (`raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII text as is).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML as Qwen3 uses it. `enable_thinking=False` pre-fills an empty think block, as Qwen3's own
# template does, so a hybrid-thinking model answers directly. Unlike Qwen3's template it keeps
# assistant messages verbatim (no stripping of earlier turns' reasoning) and renders no tools.
QWEN3_CHATML_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {%- if message['role'] is not defined or message['role'] is not string %}\n"
    "        {{- raise_exception('every message needs a string role') }}\n"
    "    {%- endif %}\n"
    "    {%- if message['content'] is string %}\n"
    "        {%- set content = message['content'] %}\n"
    "    {%- else %}\n"
    "        {%- set content = '' %}\n"
    "    {%- endif %}\n"
    "    {{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
)


class ChatTemplateError(ValueError):
    """No template, a template that called raise_exception, or one that failed to render."""


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
    context.setdefault("tools", None)
    context.setdefault("documents", None)
    try:
        return compile_template(source).render(
            messages=joined_text_parts(messages), add_generation_prompt=add_generation_prompt, **context
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render: {e}") from e


def joined_text_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose content is a list of OpenAI content parts get their text parts joined with newlines, as vLLM
    renders them: Qwen3's template reads string content only (a list renders as nothing). A part that is not text
    is a ChatTemplateError naming it: this model reads nothing else."""
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
        joined.append(message)
    return joined
