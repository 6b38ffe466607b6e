"""A chat choice's text as OpenAI's message: thinking, answer and tool calls. The reasoning parser reads every token
first (a `<tool_call>` while thinking is thinking), the tool-call parser the answer's tokens. Both decide by token
id; this module hands them each token's text, cut from the choice's deltas (server/choice.py), whose ends (stop
strings, text held back) may fall anywhere in a token's text."""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3_runtime.server.protocol import ChatCompletionRequest
from qwen3_runtime.server.reasoning import Part, ReasoningParser, ThinkTokens
from qwen3_runtime.server.tool_parser import ToolCallParser, ToolCallTokens
from qwen3_runtime.server.tool_protocol import NamedToolChoice
from qwen3_runtime.tokenizer import Tokenizer

REASONING_PARSERS = ("qwen3",)
TOOL_CALL_PARSERS = ("hermes",)


@dataclass(frozen=True)
class ChatParsers:
    """The server's --reasoning-parser and --tool-call-parser, as their tags' ids in its tokenizer (None: off)."""

    think: ThinkTokens | None = None
    tool_call: ToolCallTokens | None = None

    @classmethod
    def of(cls, tok: Tokenizer, reasoning_parser: str | None, tool_call_parser: str | None) -> ChatParsers:
        if reasoning_parser not in (None, *REASONING_PARSERS) or tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(f"unknown parser: {reasoning_parser!r}, {tool_call_parser!r}")
        return cls(
            ThinkTokens.of(tok) if reasoning_parser else None, ToolCallTokens.of(tok) if tool_call_parser else None
        )


@dataclass
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI's streamed pieces: index, id, type, function

    def extend(self, other: MessageDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls += other.tool_calls

    def stream_fields(self) -> dict:
        """A streamed chunk's delta: the thinking under both names clients read (vLLM's newer `reasoning`, the
        `reasoning_content` of SGLang and earlier vLLM)."""
        fields: dict = {"reasoning_content": self.reasoning, "reasoning": self.reasoning} if self.reasoning else {}
        fields.update({"content": self.content} if self.content else {})
        return {**fields, "tool_calls": self.tool_calls} if self.tool_calls else fields


class ChatOutput:
    """One choice's parsers and where its deltas have reached in its text."""

    def __init__(
        self,
        reasoning: ReasoningParser | None = None,
        tools: ToolCallParser | None = None,
        include_reasoning: bool = True,
        named_tool: bool = False,
    ) -> None:
        self.reasoning, self.tools = reasoning, tools
        self.include_reasoning = include_reasoning  # vLLM's: false drops the thinking from the response
        self.named_tool = named_tool  # tool_choice named a function: OpenAI finishes such a call with "stop"
        self._seen = 0  # characters of the choice's text read so far

    @classmethod
    def for_request(cls, parsers: ChatParsers, req: ChatCompletionRequest, prompt: list[int]) -> ChatOutput:
        """The reasoning parser starts where the prompt's last turn left the thinking; tool calls are parsed when
        the request gives tools and tool_choice is not "none"."""
        think, tool_call = parsers.think, parsers.tool_call
        reasoning = ReasoningParser.for_prompt(think, prompt) if think else None
        parse_tools = tool_call is not None and req.tools and req.tool_choice != "none"
        tools = ToolCallParser(tool_call, req.parallel_tool_calls is not False) if parse_tools else None
        return cls(reasoning, tools, req.include_reasoning, isinstance(req.tool_choice, NamedToolChoice))

    def delta(self, text: str, ids: list[int], offsets: list[int], finished: bool = False) -> MessageDelta:
        """What Choice.delta's (text, token ids, their offsets in the choice's text) adds to the message; finished:
        the choice's last delta, after which the parsers give what they held back. Text before the first token's
        offset is the end of a token an earlier delta began."""
        if self.reasoning is None and self.tools is None:
            return MessageDelta(content=text)
        start, self._seen = self._seen, self._seen + len(text)
        cuts = [min(max(offset - start, 0), len(text)) for offset in offsets] + [len(text)]
        out = MessageDelta()
        self._feed(None, text[: cuts[0]], out)
        for token_id, a, b in zip(ids, cuts, cuts[1:]):
            self._feed(token_id, text[a:b], out)
        if self.tools is not None:
            content, calls = self.tools.finish() if finished else ("", self.tools.pending())
            out.content += content
            out.tool_calls += calls
        return out

    def message(self, whole: MessageDelta) -> dict:
        """A response's message (not streamed) from all of its deltas: the thinking under both names, tool calls
        whole, content None when a parser took everything."""
        fields: dict = {"content": whole.content}
        if self.reasoning is not None:
            fields = {"content": whole.content or None, "reasoning_content": whole.reasoning or None}
            fields["reasoning"] = fields["reasoning_content"]
        calls: dict[int, dict] = {}
        for piece in whole.tool_calls:
            call = calls.get(piece["index"])
            if call is None:  # a call's first piece: its id and name
                calls[piece["index"]] = {"id": piece["id"], "type": "function", "function": dict(piece["function"])}
            else:
                call["function"]["arguments"] += piece["function"]["arguments"]
        if calls:
            fields.update(content=whole.content or None, tool_calls=list(calls.values()))
        return fields

    def finish_reason(self, reason: str | None) -> str | None:
        """The engine's reason, but tool_calls for an answer that ended on its own after calls (OpenAI's and vLLM's;
        not for a named tool_choice, whose call OpenAI finishes with stop)."""
        called = self.tools is not None and self.tools.calls > 0
        return "tool_calls" if reason == "stop" and called and not self.named_tool else reason

    def _feed(self, token_id: int | None, text: str, out: MessageDelta) -> None:
        if self.reasoning is not None:
            reasoning, text = self.reasoning.feed(token_id, text)
            out.reasoning += reasoning if self.include_reasoning else ""
            if self.reasoning.part is not Part.CONTENT:
                return
        if self.tools is None:
            out.content += text
            return
        content, calls = self.tools.feed(token_id, text)
        out.content += content
        out.tool_calls += calls
