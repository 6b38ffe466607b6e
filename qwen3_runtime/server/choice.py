"""One choice of a response as its updates arrive: incremental text, stop strings, and which tokens' logprobs go
with which piece of text.

Stop strings: the output is cut before the first one, and the engine request is aborted (the caller's job when
apply() returns True). While streaming, the last len(longest stop) - 1 characters are held back, since they may
start a stop string the next token completes.

Without stop strings every token goes out in the delta after it arrives, one whose text is not complete yet (part
of a character's bytes) with empty text, as vLLM streams it: its logprobs are not delayed, and a client sees a
chunk per token. With stop strings a token waits for its text, which a stop string may still cut."""

from __future__ import annotations

from qwen3_runtime.logprobs import TokenLogprob
from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.tokenizer import IncrementalDetokenizer, Tokenizer


class Choice:
    def __init__(self, index: int, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.index = index
        self.stops = stops
        self.holdback = max(map(len, stops), default=1) - 1
        self.detok = IncrementalDetokenizer(tokenizer)
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob | None] = []
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.num_prompt_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self._sent_chars = 0
        self._sent_tokens = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, up: RequestUpdate) -> bool:
        """Take an update; True when a stop string just ended the choice (abort its engine request)."""
        if up.prompt_logprobs is not None:
            self.prompt_logprobs = up.prompt_logprobs
        self.num_prompt_tokens = up.num_prompt_tokens
        if self.finished:  # a stop string ended it; the engine's last tokens are dropped
            return False
        start = len(self.text)
        self.text += "".join(self.detok.push(t) for t in up.token_ids)
        self.token_ids += up.token_ids
        self.logprobs += up.logprobs if up.logprobs is not None else [None] * len(up.token_ids)
        if up.finish_reason is not None:
            self.text += self.detok.finish()
        cut = self._find_stop(start)
        if cut is not None:
            self.text, self.finish_reason = self.text[:cut], "stop"
            return True
        if up.finish_reason is not None:
            self.finish_reason, self.error = up.finish_reason, up.error
        return False

    def _find_stop(self, start: int) -> int | None:
        """Where the first stop string begins, searching only text that could hold a new one."""
        lo = max(0, start - self.holdback)
        found = [i for i in (self.text.find(s, lo) for s in self.stops) if i >= 0]
        return min(found, default=None)

    def delta(self) -> tuple[str, list[int], list[TokenLogprob | None], list[int]]:
        """The text not sent yet (less the held-back tail), and the tokens whose text starts in it (without stop
        strings, every token not sent yet): (text, token ids, their logprobs, their offsets in the choice's text)."""
        end = len(self.text) if self.finished else max(self._sent_chars, len(self.text) - self.holdback)
        text = self.text[self._sent_chars : end]
        self._sent_chars = end
        offsets = self.detok.text_offsets
        first = last = self._sent_tokens
        stopped_early = self.finished and len(self.text) < self.detok.text_length
        while last < len(self.token_ids) and (
            offsets[last] < end
            or not self.stops  # nothing is held back: a token whose text is still incomplete goes too
            or (self.finished and not stopped_early)
            or self.finish_reason == "error"
        ):
            last += 1
        self._sent_tokens = last
        return text, self.token_ids[first:last], self.logprobs[first:last], offsets[first:last]
