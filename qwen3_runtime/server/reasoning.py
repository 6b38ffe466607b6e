"""`--reasoning-parser qwen3`: a chat answer's thinking apart from its answer, decided by token ids.

Qwen3 thinks between `<think>` and `</think>`, each one token. Its templates leave a turn in one of three states,
read from the prompt's last turn: the model opens `<think>` itself (Qwen3's hybrid template), the template opened it
already so only `</think>` is generated (Qwen3-*-Thinking-2507), or the template closed an empty think block
(`enable_thinking: false`) and everything generated is the answer. Tags are told apart by their ids, never by text:
the same characters typed inside the answer are text, and a tag cannot be split between two stream chunks."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from qwen3_runtime.input_errors import CheckpointError
from qwen3_runtime.tokenizer import Tokenizer


class Part(Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    TAG = "tag"  # a `<think>` or `</think>` that opened or closed the thinking: no one's text


@dataclass(frozen=True)
class ThinkTokens:
    start: int  # <think>
    end: int  # </think>
    turn: int | None  # <|im_start|>: where the prompt's last turn begins (None: read the whole prompt)

    @classmethod
    def of(cls, tok: Tokenizer) -> ThinkTokens:
        """The ids in this tokenizer; CheckpointError when a tag is not one token (the parser cannot see it)."""
        start, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
        if start is None or end is None:
            raise CheckpointError("--reasoning-parser qwen3: the tokenizer has no <think> and </think> tokens")
        return cls(start, end, tok.token_to_id("<|im_start|>"))


class ReasoningParser:
    """One choice's tokens in order, each fed with its text: pure state, no I/O, so it is tested token by token.

    Until the thinking ended, `<think>` opens it and `</think>` closes it; once closed (in the answer, or by the
    template), everything is content, a tag the answer quotes included. Thinking the model never closes is
    reasoning to the end (max_tokens hit while thinking)."""

    def __init__(self, tokens: ThinkTokens, thinking: bool = False, ended: bool = False) -> None:
        self.tokens = tokens
        self.thinking = thinking
        self.ended = ended
        self.part = Part.REASONING if thinking else Part.CONTENT  # the last token's part

    @classmethod
    def for_prompt(cls, tokens: ThinkTokens, prompt: list[int]) -> ReasoningParser:
        """Thinking open or ended already by the prompt's last turn (the template's doing), or neither."""
        for token in reversed(prompt):
            if token in (tokens.start, tokens.end, tokens.turn):
                return cls(tokens, thinking=token == tokens.start, ended=token == tokens.end)
        return cls(tokens)

    def feed(self, token_id: int | None, text: str) -> tuple[str, str]:
        """(reasoning, content) of one token's text; token_id None: more text of the last token (its characters
        completed later, as streaming detokenization gives them)."""
        if token_id is not None:
            self.part = self._part_of(token_id)
        if self.part is Part.REASONING:
            return text, ""
        return ("", text) if self.part is Part.CONTENT else ("", "")

    def _part_of(self, token_id: int) -> Part:
        if not self.ended and token_id == self.tokens.start and not self.thinking:
            self.thinking = True
            return Part.TAG
        if self.thinking and token_id == self.tokens.end:
            self.thinking, self.ended = False, True
            return Part.TAG
        return Part.REASONING if self.thinking else Part.CONTENT
