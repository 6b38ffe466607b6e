"""Streaming detokenization that never emits half a UTF-8 character."""

from __future__ import annotations

import codecs

from qwen3_runtime.tokenizer.core import Tokenizer


class IncrementalDetokenizer:
    """Streaming text for one request: each push returns only whole characters, never half a UTF-8 sequence.

    Bytes are fed through an incremental UTF-8 decoder, so a character split across byte-level tokens (emoji, CJK)
    is emitted when its last byte arrives, and invalid bytes become U+FFFD exactly as `Tokenizer.decode` does:
    the pushes concatenated equal decode(all ids). `text_offsets[i]` is where token i's text starts in the produced
    text (OpenAI completions `text_offset`): a token that completes a character points at that character's start.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = tokenizer.special_ids if skip_special_tokens else frozenset()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._length = 0
        self.text_offsets: list[int] = []
        self._finished = False

    def push(self, token_id: int, render: bool = True) -> str:
        """Add one generated token; return the text it completes (possibly empty). render=False: the token has an
        offset but no text (the stop token that ended a request), like a skipped special token."""
        if self._finished:
            raise RuntimeError("push after finish")
        self.text_offsets.append(self._length)
        if not render or token_id in self._skip:
            return ""
        text = self._decoder.decode(self._tokenizer.token_bytes(token_id))
        self._length += len(text)
        return text

    def finish(self) -> str:
        """End of stream: trailing bytes of a cut character come out as U+FFFD, as decode() gives them."""
        if self._finished:
            return ""
        self._finished = True
        text = self._decoder.decode(b"", final=True)
        self._length += len(text)
        return text

    @property
    def text_length(self) -> int:
        """Characters produced so far."""
        return self._length


def detokenize(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool = False) -> tuple[str, list[int]]:
    """The text of `ids` and where each token's text starts in it (IncrementalDetokenizer.text_offsets)."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
    text = "".join(detok.push(t) for t in ids) + detok.finish()
    return text, detok.text_offsets
