"""Replays the greedy and seeded requests that completed through the offline Runtime (same config, a few
requests at a time) and compares: text, finish reasons and tokens exactly; logprobs within `tol`.

Two exceptions, the ones rounding allows (in another batch the matmuls round differently, on the GPU the more
so): a greedy output may leave the offline one where the offline top two tokens are within `tie_tol` (a
near-tie); such a choice is compared up to that token and counted as diverged; greedy items ask the offline
engine for at least two logprobs to tell. And a prompt token's rank may move past the tokens whose logprobs lie
within `tie_tol` of its own. `tie_tol` 0 allows neither.

The server does not send token ids, so a token is compared by what it sends for it: its string (completions'
`tokens`, top_logprobs keys), its bytes (chat) or its id (prompt_logprobs)."""

from __future__ import annotations

import bisect
import math
import re
from array import array
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from qwen3_runtime import Runtime, SamplingParams
from qwen3_runtime.params import RequestLimits
from qwen3_runtime.server.inputs import InputContext, chat_inputs, completion_inputs
from qwen3_runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from qwen3_runtime.tokenizer import Tokenizer, detokenize
from scripts.soak.client import Choice, Result


@dataclass
class Item:
    result: Result
    choice: int
    prompt: list[int]
    params: SamplingParams
    asked_logprobs: int | None  # the request's; params.logprobs may be more (a greedy item's runner-up)


@dataclass
class Mismatch:
    request: int
    choice: int
    what: str
    got: object
    want: object


def engine_inputs(result: Result, tok: Tokenizer, limits: RequestLimits, defaults: dict[str, Any]) -> list[Item]:
    """The engine requests the server made of this HTTP request, by the server's own code (server/inputs.py);
    `limits` and `defaults` the Runtime's. A greedy item asks for two logprobs at least, to see near-ties."""
    body, ctx = result.spec.body, InputContext(tok, limits, defaults)
    if result.spec.route == "chat":
        inputs = chat_inputs(ChatCompletionRequest(**body), ctx)
    else:
        inputs = completion_inputs(CompletionRequest(**body), ctx)
    items = []
    for j, x in enumerate(inputs):
        params = replace(x.params, logprobs=max(x.params.logprobs or 0, 2)) if x.params.greedy else x.params
        items.append(Item(result, j, x.prompt, params, x.params.logprobs))
    return items


class Comparer:
    def __init__(self, tok: Tokenizer, tol: float, tie_tol: float) -> None:
        self.tok, self.tol, self.tie_tol = tok, tol, tie_tol
        self.mismatches: list[Mismatch] = []
        self.choices = self.tokens = self.logprobs = 0  # compared
        self.diverged = 0  # greedy choices that left the offline output at a near-tie
        self.differences = array("d")  # |server - offline| of every finite logprob pair: the rounding's scale

    def _bad(self, item: Item, what: str, got: object, want: object) -> None:
        self.mismatches.append(Mismatch(item.result.spec.index, item.choice, what, got, want))

    def _close(self, a: float | None, b: float) -> bool:
        self.logprobs += 1
        if a is not None and math.isfinite(b):
            self.differences.append(abs(a - b))
        return a is not None and abs(a - b) <= self.tol

    def _rank_close(self, got: int, want: int, logprob: float, top: float) -> bool:
        """A rank counts the tokens above: rounding that moves logprobs by up to tie_tol may carry those within it
        of this one across. How many: the want - 1 tokens above, spread over [logprob, top], per unit."""
        spread = top - logprob
        slack = math.ceil((want - 1) * 2 * self.tie_tol / spread) if spread > 0 else 0
        return abs(got - want) <= slack

    def summary(self) -> dict:
        """Mismatches by field (positions pooled) and how many of the compared choices have any: a few choices
        off everywhere (a batch's rounding) read differently from many off at one field."""
        fields = Counter(re.sub(r"\[\d+\]", "", m.what) for m in self.mismatches)
        choices = {(m.request, m.choice) for m in self.mismatches}
        return {"by_field": dict(fields.most_common()), "choices_with_any": len(choices), "choices": self.choices}

    def difference_quantiles(self) -> dict[str, float]:
        """p50, p99, p99.99 and max of the logprob differences."""
        d = np.sort(np.frombuffer(self.differences, dtype=np.float64)) if self.differences else np.zeros(1)
        return {q: float(d[min(len(d) - 1, int(f * len(d)))]) for q, f in (("p50", 0.5), ("p99", 0.99),
                ("p99.99", 0.9999), ("max", 1.0))}  # fmt: skip

    def compare(self, item: Item, out) -> None:
        self.choices += 1
        spec, c = item.result.spec, item.result.choices[item.choice]
        # The server shows no text for special tokens, nor for the stop token that ended a request (vLLM's way).
        shown = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
        full, offsets = detokenize(self.tok, shown, skip_special_tokens=True)
        stops = [
            s
            for s in ([spec.body["stop"]] if isinstance(spec.body.get("stop"), str) else spec.body.get("stop") or [])
            if s
        ]
        cut = min((i for i in (full.find(s) for s in stops) if i >= 0), default=None)
        want_text, want_finish = (full, out.finish_reason) if cut is None else (full[:cut], "stop")
        prefix = detokenize(self.tok, item.prompt)[0] if spec.body.get("echo") else ""
        upto = None  # tokens compared, where the output diverged at a near-tie
        if c.text != prefix + want_text:
            upto = self._near_tie(item, out, c.text, prefix, want_text, offsets)
            if upto is None:
                self._bad(item, "text", c.text, prefix + want_text)
            else:
                self.diverged += 1
        if upto is None and c.finish_reason != want_finish:
            self._bad(item, "finish_reason", c.finish_reason, want_finish)
        self.tokens += len(out.token_ids) if upto is None else upto
        if c.logprobs is not None:
            n_prompt = len(item.prompt) if spec.body.get("echo") else 0
            check = self._chat_logprobs if spec.route == "chat" else self._completion_logprobs
            check(item, c, out, n_prompt, cut is None and upto is None, upto)
        if spec.body.get("prompt_logprobs") is not None:
            self._prompt_logprobs(item, c, out)

    def _near_tie(self, item: Item, out, text: str, prefix: str, want: str, offsets: list[int]) -> int | None:
        """The offline token where a greedy choice's text departs from the offline text, if the offline top two
        there are within tie_tol: the number of tokens still comparable. None: not such a divergence."""
        if not item.params.greedy or not text.startswith(prefix) or not out.logprobs:
            return None
        got = text[len(prefix) :]
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        # The offline tokens that produce that character (a token may end mid-character: the next one completes it).
        candidates = range(max(0, bisect.bisect_left(offsets, first) - 1), bisect.bisect_right(offsets, first))
        for token in candidates:
            top = out.logprobs[token].top_logprobs if token < len(out.logprobs) else []
            if len(top) >= 2 and top[0] - top[1] <= self.tie_tol:
                return token
        return None

    def _completion_logprobs(
        self, item: Item, c: Choice, out, n_prompt: int, whole: bool, upto: int | None = None
    ) -> None:
        tokens, values = c.logprobs["tokens"][n_prompt:][:upto], c.logprobs["token_logprobs"][n_prompt:][:upto]
        tops = c.logprobs["top_logprobs"][n_prompt:][:upto]
        want = self.tok.token_strings(out.token_ids)[:upto]
        if tokens != want[: len(tokens)] or (whole and len(tokens) != len(want)):
            return self._bad(item, "logprobs.tokens", tokens, want)
        for i, (v, top, lp, token) in enumerate(zip(values, tops, out.logprobs, want)):
            if not self._close(v, lp.logprob):
                self._bad(item, f"token_logprobs[{i}]", v, lp.logprob)
            want_top = {token: lp.logprob}  # the token itself first, then the top k
            k = item.asked_logprobs
            for t, x in zip(self.tok.token_strings(lp.top_ids[:k]), lp.top_logprobs[:k]):
                want_top.setdefault(t, x)
            if set(top) != set(want_top) or not all(self._close(top[k], want_top[k]) for k in top):
                self._bad(item, f"top_logprobs[{i}]", top, want_top)

    def _chat_logprobs(self, item: Item, c: Choice, out, n_prompt: int, whole: bool, upto: int | None = None) -> None:
        content, k = c.logprobs["content"][:upto], item.asked_logprobs
        if whole and len(content) != len(out.token_ids):
            return self._bad(item, "logprobs.content length", len(content), len(out.token_ids))
        for i, (entry, t, lp) in enumerate(zip(content, out.token_ids, out.logprobs)):
            want_top = [(list(self.tok.token_bytes(x)), v) for x, v in zip(lp.top_ids[:k], lp.top_logprobs[:k])]
            got_top = [(e["bytes"], e["logprob"]) for e in entry["top_logprobs"]]
            same_top = [b for b, _ in got_top] == [b for b, _ in want_top] and all(
                self._close(g, w) for (_, g), (_, w) in zip(got_top, want_top)
            )
            if entry["bytes"] != list(self.tok.token_bytes(t)) or not self._close(entry["logprob"], lp.logprob):
                self._bad(item, f"content[{i}]", (entry["bytes"], entry["logprob"]), (t, lp.logprob))
            elif not same_top:
                self._bad(item, f"content[{i}].top_logprobs", got_top, want_top)

    def _prompt_logprobs(self, item: Item, c: Choice, out) -> None:
        got, want = c.prompt_logprobs or [], out.prompt_logprobs or []
        if len(got) != len(want) or (got and got[0] is not None):
            return self._bad(item, "prompt_logprobs length", len(got), len(want))
        for i, (g, lp) in enumerate(zip(got[1:], want[1:]), start=1):
            expect = {str(lp.token_id): (lp.logprob, lp.rank)}
            for rank, (t, v) in enumerate(zip(lp.top_ids, lp.top_logprobs), start=1):
                expect.setdefault(str(t), (v, rank))
            ok = g is not None and set(g) == set(expect)
            top = lp.top_logprobs[0] if lp.top_logprobs else 0.0  # no top asked: 0 bounds the largest logprob
            ok = ok and all(
                self._rank_close(g[k]["rank"], r, v, top) and self._close(g[k]["logprob"], v)
                for k, (v, r) in expect.items()
            )
            if not ok:
                self._bad(item, f"prompt_logprobs[{i}]", g, expect)


def replay(
    results: list[Result], config: str, overrides: dict, tol: float, tie_tol: float, group: int, limit: int
) -> Comparer:
    """Replays the first `limit` reproducible requests that completed (-1: all), `group` at a time."""
    rt = Runtime.from_yaml(config, overrides)
    comparer = Comparer(rt.tokenizer, tol, tie_tol)
    done = [r for r in results if r.spec.reproducible and r.outcome == "ok"]
    items = [
        it
        for r in done[: limit if limit >= 0 else None]
        for it in engine_inputs(r, rt.tokenizer, rt.limits, rt.sampling_defaults)
    ]
    for start in range(0, len(items), group):
        chunk = items[start : start + group]
        for item, out in zip(chunk, rt.generate([it.prompt for it in chunk], [it.params for it in chunk])):
            comparer.compare(item, out)
    return comparer
