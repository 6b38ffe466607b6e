"""`--tool-call-parser hermes`: the tool calls in a chat answer, in the format Qwen3's chat template asks for,
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, as OpenAI's `tool_calls` (streamed: each call's
id and name first, then its arguments in pieces).

The tags are single tokens in Qwen3's vocabulary and are told apart by id, so the same characters inside an
argument are text. A block whose JSON is not a call (malformed, no name, arguments not an object) stays content,
tags and all, as vLLM leaves it; streamed, a call whose name went out already cannot be taken back, so its
arguments end as the JSON of what could be read of them. Whitespace alone between content and calls (the
template's newlines) is dropped; other content is kept wherever it stands. Arguments stream as the part of their
final JSON text that no later token can change (partial-json-parser reads the open object), so the pieces join
into the string a response that is not streamed gives: json.dumps(arguments, ensure_ascii=False)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import partial_json_parser
from partial_json_parser.core.exceptions import MalformedJSON

from qwen3_runtime.input_errors import CheckpointError
from qwen3_runtime.tokenizer import Tokenizer
from qwen3_runtime.validation import is_text

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
# Partial strings are left out while the name is read, so a name is only ever seen whole.
_WHOLE_STRINGS = partial_json_parser.Allow.ALL & ~partial_json_parser.Allow.STR
# A string may end in the first half of a surrogate pair ("\ud83d" before "\ude00"): not sent until whole.
_HIGH_SURROGATES = "".join(map(chr, range(0xD800, 0xDC00)))


@dataclass(frozen=True)
class ToolCallTokens:
    start: int  # <tool_call>
    end: int  # </tool_call>

    @classmethod
    def of(cls, tok: Tokenizer) -> ToolCallTokens:
        """The ids in this tokenizer; CheckpointError when a tag is not one token (the parser could not see it)."""
        start, end = tok.token_to_id(OPEN_TAG), tok.token_to_id(CLOSE_TAG)
        if start is None or end is None:
            raise CheckpointError(f"--tool-call-parser hermes: the tokenizer has no {OPEN_TAG} and {CLOSE_TAG} tokens")
        return cls(start, end)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a whole block, or None when it is not a call (or holds an unpaired
    surrogate, "\\ud800", which no UTF-8 response can carry)."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict) or not is_text(call["name"] + dumps(arguments)):
        return None
    return call["name"], dumps(arguments)


def stable_prefix(value: Any) -> str:
    """The start of dumps(final value) that a partial value (partial-json-parser's, of an unfinished text) fixes
    already: all but the last member along its open end, and of that one only a string's characters so far (no
    closing quote, nor a trailing half of a surrogate pair). A number or literal there may still change (1. -> 1.5,
    1.5e -> 1.5e3), so it waits."""
    if isinstance(value, dict) and value:
        *done, last = value.items()
        members = [f"{dumps(k)}: {dumps(v)}" for k, v in done] + [f"{dumps(last[0])}: {stable_prefix(last[1])}"]
        return "{" + ", ".join(members)
    if isinstance(value, list) and value:
        return "[" + ", ".join([*map(dumps, value[:-1]), stable_prefix(value[-1])])
    if isinstance(value, str):
        return dumps(value.rstrip(_HIGH_SURROGATES))[:-1]
    return "{" if isinstance(value, dict) else "[" if isinstance(value, list) else ""


@dataclass
class _Block:
    """One `<tool_call>` block as its text arrives."""

    body: str = ""  # the JSON between the tags
    index: int = -1  # its index in tool_calls once it is a call (its id and name went out)
    sent: str = ""  # the argument text sent so far
    arguments: dict = field(default_factory=dict)  # the arguments as last read (partial)
    malformed: bool = False  # a partial parse failed: the whole block decides at its end
    dropped: bool = False  # a second call when parallel_tool_calls is false


class ToolCallParser:
    """One choice's content tokens in order, each fed with its text (as ReasoningParser hands them on): pure
    state, so it is tested token by token. `feed` returns the content and the tool-call deltas that token
    completes; `pending` those of a block still open (once per chunk: its JSON is parsed again each time);
    `finish` the rest at the end of the answer."""

    def __init__(self, tokens: ToolCallTokens, parallel: bool = True) -> None:
        self.tokens = tokens
        self.parallel = parallel  # false: the first call alone is kept
        self.calls = 0
        self._block: _Block | None = None
        self._last = "content"  # what the last token's text belongs to: content, tag or body
        self._held = ""  # trailing whitespace of the content: dropped if a call follows

    def feed(self, token_id: int | None, text: str) -> tuple[str, list[dict]]:
        """(content, tool-call deltas) of one token's text; token_id None: more text of the last token."""
        block = self._block
        if token_id is not None:
            if token_id == self.tokens.start and block is None:
                self._block, self._last = _Block(), "tag"
                return "", []
            if token_id == self.tokens.end and block is not None:
                self._block, self._last = None, "tag"
                return self._close(block, CLOSE_TAG)
            self._last = "content" if block is None else "body"
        if self._last == "body":
            block.body += text
        return (self._content(text) if self._last == "content" else ""), []

    def pending(self) -> list[dict]:
        """The deltas of the open block's text so far: its id and name once the name is whole, then the arguments'
        stable prefix."""
        block = self._block
        if block is None or block.malformed or block.dropped or not block.body.strip():
            return []
        try:
            deltas = []
            if block.index < 0:
                name = _object(partial_json_parser.loads(block.body, _WHOLE_STRINGS)).get("name")
                if not isinstance(name, str):
                    return []  # not whole yet, or not a name: the block's end decides
                deltas = self._header(block, name)
            arguments = _object(partial_json_parser.loads(block.body)).get("arguments")
            if not block.dropped and isinstance(arguments, dict):
                block.arguments = arguments
                deltas += self._arguments(block, stable_prefix(arguments))
            return deltas
        except (MalformedJSON, ValueError):
            block.malformed = True
            return []

    def finish(self) -> tuple[str, list[dict]]:
        """A block left open at the end is read as if closed (vLLM reads an unterminated last block too); trailing
        whitespace is content unless a call was made."""
        content, deltas = ("", []) if self._block is None else self._close(self._block, "")
        self._block, tail, self._held = None, "" if self.calls else self._held, ""
        return content + tail, deltas

    def _close(self, block: _Block, closing: str) -> tuple[str, list[dict]]:
        parsed = parse_call(block.body)
        if parsed is None and block.index >= 0:  # named already: what was read of the arguments, closed
            return "", self._arguments(block, dumps(block.arguments))
        if parsed is None:
            return self._content(OPEN_TAG + block.body + closing), []
        name, arguments = parsed
        deltas = self._header(block, name) if block.index < 0 else []
        return "", [] if block.dropped else deltas + self._arguments(block, arguments)

    def _header(self, block: _Block, name: str) -> list[dict]:
        if not is_text(name):
            raise ValueError("an unpaired surrogate in the name")
        if self.calls and not self.parallel:
            block.dropped = True
            return []
        block.index, self.calls, self._held = self.calls, self.calls + 1, ""
        function = {"name": name, "arguments": ""}
        return [{"index": block.index, "id": f"call_{secrets.token_hex(12)}", "type": "function", "function": function}]

    def _arguments(self, block: _Block, text: str) -> list[dict]:
        """The piece of `text` past what was sent (none unless it extends it)."""
        if not text.startswith(block.sent) or text == block.sent or not is_text(text):
            return []
        piece, block.sent = text[len(block.sent) :], text
        return [{"index": block.index, "function": {"arguments": piece}}]

    def _content(self, text: str) -> str:
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept) :]
        return kept


def _object(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError("a tool call is a JSON object")
    return value
