"""One choice of a response as its updates arrive: incremental text, stop strings, and which tokens' logprobs go
with which piece of text.

As vLLM renders it: special tokens give no text (unless skip_special_tokens is off), nor does the stop token that
ended the request (EOS or one of stop_token_ids), and the output is cut before the first stop string, after it
with include_stop_str_in_output; the engine request is then aborted (the caller's job when apply() returns True).
Every token the engine produced up to the end keeps its place and its logprobs, as usage counts it, text or not.
While streaming, the last len(longest stop) - 1 characters are held back, since they may start a stop string the
next token completes (not when the stop string is kept).

Without stop strings every token goes out in the delta after it arrives, one whose text is not complete yet (part
of a character's bytes) with empty text, as vLLM streams it: its logprobs are not delayed, and a client sees a
chunk per token. With stop strings a token waits for its text, which a stop string may still cut."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from qwen3_runtime.logprobs import TokenLogprob
from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(frozen=True)
class TextOptions:
    """How a request's tokens become its text (vLLM's names and defaults)."""

    stops: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


class Choice:
    def __init__(
        self,
        index: int,
        tokenizer: Tokenizer,
        options: TextOptions,
        stop_token_ids: Iterable[int] = (),
        ignore_eos: bool = False,
    ) -> None:
        self.index = index
        # vLLM tests the tokenizer's EOS before stop_token_ids (unless ignore_eos): ending on it names no
        # stop_reason, listed or not.
        eos = None if ignore_eos else tokenizer.token_to_id(tokenizer.special_tokens_map.get("eos_token", ""))
        self.stop_token_ids = frozenset(stop_token_ids) - {eos}
        self.stops = options.stops
        self.include_stop = options.include_stop_str_in_output
        self.lookback = max(map(len, self.stops), default=1) - 1  # where a stop string may start in earlier text
        self.holdback = 0 if self.include_stop else self.lookback
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=options.skip_special_tokens)
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob | None] = []
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.num_prompt_tokens = 0
        self.finish_reason: str | None = None
        # vLLM's: the stop string or the request's stop token that ended the choice (None: EOS, length, error).
        self.stop_reason: str | int | None = None
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
        # A stop token ends the update: its text is not the answer's.
        rendered = len(up.token_ids) - (up.finish_reason == "stop" and not self.include_stop)
        self.text += "".join(self.detok.push(t, render=i < rendered) for i, t in enumerate(up.token_ids))
        self.token_ids += up.token_ids
        self.logprobs += up.logprobs if up.logprobs is not None else [None] * len(up.token_ids)
        if up.finish_reason is not None:
            self.text += self.detok.finish()
        found = self._find_stop(start)
        if found is not None:
            cut, self.stop_reason = found
            self.text, self.finish_reason = self.text[:cut], "stop"
            return True
        if up.finish_reason is not None:
            self.finish_reason, self.error = up.finish_reason, up.error
            if up.finish_reason == "stop" and up.token_ids and up.token_ids[-1] in self.stop_token_ids:
                self.stop_reason = up.token_ids[-1]
        return False

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        """The first stop string in the text and where the text ends at it (before it, or after it when kept),
        searching only text that could hold a new one."""
        lo = max(0, start - self.lookback)
        found = [(i, s) for s in self.stops if (i := self.text.find(s, lo)) >= 0]
        if not found:
            return None
        i, stop = min(found, key=lambda f: f[0])
        return (i + len(stop) if self.include_stop else i), stop

    def delta(self) -> tuple[str, list[int], list[TokenLogprob | None], list[int]]:
        """The text not sent yet (less the held-back tail), and the tokens whose text starts in it (without stop
        strings, or once finished, every token not sent yet): (text, token ids, their logprobs, their offsets in
        the choice's text)."""
        end = len(self.text) if self.finished else max(self._sent_chars, len(self.text) - self.holdback)
        text = self.text[self._sent_chars : end]
        self._sent_chars = end
        offsets = self.detok.text_offsets
        first = last = self._sent_tokens
        # Without stop strings nothing is held back: a token whose text is still incomplete goes too.
        while last < len(self.token_ids) and (offsets[last] < end or not self.stops or self.finished):
            last += 1
        self._sent_tokens = last
        return text, self.token_ids[first:last], self.logprobs[first:last], offsets[first:last]
