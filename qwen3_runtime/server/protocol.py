"""The OpenAI request bodies (pydantic). Types and ranges are checked here (a 400 naming the field); limits that
only the model knows (vocabulary, max_model_len, max_logprobs) are checked by params.check_request.

A field that would change the output but that this server does not implement is refused (a 400 naming it)
unless it holds its "off" value, which many clients send by default: silently ignoring it would return an answer
the client did not ask for. Fields OpenAI's API does not know are ignored with a warning, as vLLM does."""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from qwen3_runtime.params import MAX_REPETITION_PENALTY
from qwen3_runtime.server.choice import TextOptions
from qwen3_runtime.server.errors import refused
from qwen3_runtime.server.structured_protocol import ResponseFormat, StructuredOutputs
from qwen3_runtime.server.tool_protocol import ChatTool, ToolChoice, check_tools
from qwen3_runtime.validation import is_text

log = logging.getLogger(__name__)

SAME_AS_N = object()  # in an "off" tuple: the request's own n (best_of = n picks nothing)

# field -> its "off" values. OpenAI's fields and vLLM's sampling extensions; for both endpoints.
UNSUPPORTED: dict[str, tuple] = {
    "length_penalty": (None, 1),
    "use_beam_search": (None, False),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "truncate_prompt_tokens": (None,),
}
UNSUPPORTED_COMPLETION = {**UNSUPPORTED, "suffix": (None, ""), "best_of": (None, SAME_AS_N)}
UNSUPPORTED_CHAT = {
    **UNSUPPORTED,
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "verbosity": (None,),
    "prompt_logprobs": (None,),  # vLLM's; implemented for completions only
    "echo": (None, False),
    "continue_final_message": (None, False),
    "chat_template": (None,),
}
# The roles Qwen3's chat template renders: it drops a message of any other role without a word. OpenAI's
# "developer" is its newer name for "system" (o1 and later), and reaches the template as one.
ROLES = ("system", "user", "assistant", "tool")
TEMPLATE_ROLES = {"developer": "system"}
# Known to OpenAI's API, and no effect on the output: accepted without a word.
METADATA = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key"})
_warned: set[str] = set()
_MAX_WARNED = 1000  # a client inventing names cannot grow this (or the log) without bound


def unpaired_surrogate(body: dict) -> str | None:
    """The path of the first string holding a lone surrogate (JSON's "\\ud800" decodes to one; "" for a top-level
    field name), None when there is none: the tokenizer and the UTF-8 response cannot take one. A loop, not
    recursion: the body may nest as deep as the JSON parser allowed."""
    todo: list[tuple[str, Any]] = [("", body)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, str) and not is_text(value):
            return path
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(key, str) and not is_text(key):
                return path  # the object holding it: the key itself cannot be written out
            todo.append((f"{path}.{key}".lstrip(".") if isinstance(key, str) else f"{path}[{key}]", item))
    return None


def refuse_unless_off(data: dict, unsupported: dict[str, tuple]) -> None:
    """A 400 naming the first field of `unsupported` that does not hold one of its off values."""
    for name, value in data.items():
        if name in unsupported:
            off = [data.get("n", 1) if v is SAME_AS_N else v for v in unsupported[name]]
            if value not in off:
                accepted = " or ".join("n" if v is SAME_AS_N else json.dumps(v) for v in unsupported[name])
                raise refused(name, f"{name} is not supported by this server (accepted only when off: {accepted})")


def check_messages(messages: list[ChatMessage] | None) -> None:
    for i, m in enumerate(messages or ()):
        m.check(i)


class _Request(BaseModel):
    # NaN and inf are JSON extensions Python's parser reads: any float field given one is a 400 saying it must be
    # a finite number, not that NaN fails a bound.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    unsupported: ClassVar[dict[str, tuple]] = UNSUPPORTED

    model: str | None = None
    # None (unset): the model's default (its generation_config.json's) or else SamplingParams' (OpenAI's).
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    # vLLM's sampling extensions and OpenAI's penalties.
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=MAX_REPETITION_PENALTY)
    min_tokens: int | None = Field(None, ge=0)  # at most max_tokens: checked with the params
    # OpenAI's: token id (a string, as JSON's keys are) -> a bias in [-100, 100], both checked with the params.
    logit_bias: dict[int, float] | None = None

    def sampling_fields(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """The fields above for SamplingParams: those given, the model's `defaults` for the others."""
        names = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty")
        names += ("repetition_penalty", "min_tokens", "logit_bias")
        given = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        return {**{k: v for k, v in defaults.items() if k in names}, **given}

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _token_id_keys(cls, value: Any) -> Any:
        """Keys as ints, a key that is not one named in the 400."""
        if not isinstance(value, dict):
            return value
        bias = {}
        for key, number in value.items():
            try:
                bias[int(key)] = number
            except ValueError:
                raise refused("logit_bias", f"logit_bias key {key!r} is invalid: expected a token id") from None
        return bias

    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int = Field(1, ge=1, le=128)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # vLLM's: how the tokens become text (server/choice.py).
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Structured outputs (structured_protocol.py): at most one of these.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _check_extra_fields(cls, data: Any) -> Any:
        """Refuse an unsupported field that is not off; warn once about a field OpenAI's API does not know."""
        if not isinstance(data, dict):
            return data
        bad = unpaired_surrogate(data)
        if bad is not None:
            where = bad or "a field name"
            raise refused(bad, f"{where} is not valid Unicode: it holds an unpaired surrogate (e.g. \\ud800)")
        refuse_unless_off(data, cls.unsupported)
        for name in data.keys() - cls.unsupported.keys() - cls.model_fields.keys() - METADATA - _warned:
            if len(_warned) < _MAX_WARNED:
                _warned.add(name)
                log.warning("request field %r is not part of OpenAI's API: ignored", name)
        return data

    def text_options(self) -> TextOptions:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return TextOptions([s for s in stops if s], self.skip_special_tokens, self.include_stop_str_in_output)


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(_Request):
    unsupported: ClassVar[dict[str, tuple]] = UNSUPPORTED_COMPLETION

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    # -1: the whole vocabulary, where logprobs.max_logprobs is -1 (params.check_request says so otherwise).
    logprobs: int | None = Field(None, ge=-1)
    echo: bool = False
    prompt_logprobs: int | None = Field(None, ge=-1)  # vLLM's extension


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def check(self, i: int) -> None:
        """A role the chat template renders (else the message would vanish from the prompt), and content parts
        that are text: this model reads nothing else (images, audio, files)."""
        if self.role not in ROLES and self.role not in TEMPLATE_ROLES:
            param, roles = f"messages[{i}].role", ", ".join((*ROLES, *TEMPLATE_ROLES))
            raise refused(param, f"{param} {self.role!r} is not supported: the roles are {roles}")
        for j, part in enumerate(self.content if isinstance(self.content, list) else ()):
            if part.get("type") != "text":
                param = f"messages[{i}].content[{j}].type"
                raise refused(param, f"{param} {part.get('type')!r} is not supported: only 'text' content parts are")
            if not isinstance(part.get("text"), str):
                param = f"messages[{i}].content[{j}].text"
                raise refused(param, f"{param} must be a string")

    def as_template_input(self) -> dict[str, Any]:
        """The message for the chat template (which joins text parts, tokenizer/chat_template.py), in the
        template's role."""
        message = {**self.model_dump(exclude_none=True), "role": TEMPLATE_ROLES.get(self.role, self.role)}
        if "reasoning" in message:  # vLLM's newer name for the thinking, which Qwen3's template reads as this
            message.setdefault("reasoning_content", message["reasoning"])
        return message


class ChatCompletionRequest(_Request):
    unsupported: ClassVar[dict[str, tuple]] = UNSUPPORTED_CHAT

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, as OpenAI's default
    parallel_tool_calls: bool | None = None  # false: at most one call
    include_reasoning: bool = True  # vLLM's: false leaves the thinking out (with --reasoning-parser)

    @model_validator(mode="after")
    def _check_messages(self) -> ChatCompletionRequest:
        check_messages(self.messages)
        check_tools(self.tools, self.tool_choice)
        return self


_Request.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
