"""Replays the greedy and seeded requests that completed through the offline Runtime (same config, a few
requests at a time) and compares: text, finish reasons and tokens exactly; logprobs within `tol`.

The server does not send token ids, so a token is compared by what it sends for it: its string (completions'
`tokens`, top_logprobs keys), its bytes (chat) or its id (prompt_logprobs)."""

from __future__ import annotations

from dataclasses import dataclass

from qwen3_runtime import Runtime, SamplingParams
from qwen3_runtime.tokenizer import IncrementalDetokenizer, Tokenizer
from scripts.soak.client import Choice, Result


@dataclass
class Item:
    result: Result
    choice: int
    prompt: list[int]
    params: SamplingParams


@dataclass
class Mismatch:
    request: int
    choice: int
    what: str
    got: object
    want: object


def engine_inputs(result: Result, tok: Tokenizer) -> list[Item]:
    """The engine requests the server made of this HTTP request (as server/inputs.py does)."""
    b, spec = result.spec.body, result.spec
    if spec.route == "chat":
        prompt = tok.encode(tok.apply_chat_template(b["messages"], True))
        logprobs = (b.get("top_logprobs") or 0) if b.get("logprobs") else None
        fields = dict(max_tokens=b["max_tokens"], logprobs=logprobs)
    else:
        prompt = spec.prompt_ids or tok.encode(b["prompt"])
        prompt_logprobs, logprobs = b.get("prompt_logprobs"), b.get("logprobs")
        if b.get("echo") and logprobs is not None:
            prompt_logprobs = max(prompt_logprobs or 0, logprobs)
        fields = dict(max_tokens=b["max_tokens"], logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    sampling = dict(temperature=b.get("temperature", 1.0), top_p=b.get("top_p", 1.0), top_k=b.get("top_k", -1))
    items = []
    for j in range(b.get("n", 1)):
        seed = None if b.get("seed") is None else b["seed"] + j
        items.append(Item(result, j, list(prompt), SamplingParams(seed=seed, **sampling, **fields)))
    return items


def detokenize(tok: Tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    detok = IncrementalDetokenizer(tok)
    text = "".join(detok.push(t) for t in ids) + detok.finish()
    return text, list(detok.text_offsets)


class Comparer:
    def __init__(self, tok: Tokenizer, tol: float) -> None:
        self.tok, self.tol = tok, tol
        self.mismatches: list[Mismatch] = []
        self.tokens = self.logprobs = 0  # compared

    def _bad(self, item: Item, what: str, got: object, want: object) -> None:
        self.mismatches.append(Mismatch(item.result.spec.index, item.choice, what, got, want))

    def _close(self, a: float | None, b: float) -> bool:
        self.logprobs += 1
        return a is not None and abs(a - b) <= self.tol

    def compare(self, item: Item, out) -> None:
        spec, c = item.result.spec, item.result.choices[item.choice]
        full, _ = detokenize(self.tok, out.token_ids)
        stops = [
            s
            for s in ([spec.body["stop"]] if isinstance(spec.body.get("stop"), str) else spec.body.get("stop") or [])
            if s
        ]
        cut = min((i for i in (full.find(s) for s in stops) if i >= 0), default=None)
        want_text, want_finish = (full, out.finish_reason) if cut is None else (full[:cut], "stop")
        prefix = detokenize(self.tok, item.prompt)[0] if spec.body.get("echo") else ""
        if c.text != prefix + want_text:
            self._bad(item, "text", c.text, prefix + want_text)
        if c.finish_reason != want_finish:
            self._bad(item, "finish_reason", c.finish_reason, want_finish)
        self.tokens += len(out.token_ids)
        if c.logprobs is not None:
            n_prompt = len(item.prompt) if spec.body.get("echo") else 0
            check = self._chat_logprobs if spec.route == "chat" else self._completion_logprobs
            check(item, c, out, n_prompt, cut is None)
        if spec.body.get("prompt_logprobs") is not None:
            self._prompt_logprobs(item, c, out)

    def _completion_logprobs(self, item: Item, c: Choice, out, n_prompt: int, whole: bool) -> None:
        tokens, values = c.logprobs["tokens"][n_prompt:], c.logprobs["token_logprobs"][n_prompt:]
        tops = c.logprobs["top_logprobs"][n_prompt:]
        want = self.tok.token_strings(out.token_ids)
        if tokens != want[: len(tokens)] or (whole and len(tokens) != len(want)):
            return self._bad(item, "logprobs.tokens", tokens, want)
        for i, (v, top, lp) in enumerate(zip(values, tops, out.logprobs)):
            if not self._close(v, lp.logprob):
                self._bad(item, f"token_logprobs[{i}]", v, lp.logprob)
            want_top: dict[str, float] = {}
            for t, x in zip(self.tok.token_strings(lp.top_ids), lp.top_logprobs):
                want_top.setdefault(t, x)
            if set(top) != set(want_top) or not all(self._close(top[k], want_top[k]) for k in top):
                self._bad(item, f"top_logprobs[{i}]", top, want_top)

    def _chat_logprobs(self, item: Item, c: Choice, out, n_prompt: int, whole: bool) -> None:
        content = c.logprobs["content"]
        if whole and len(content) != len(out.token_ids):
            return self._bad(item, "logprobs.content length", len(content), len(out.token_ids))
        for i, (entry, t, lp) in enumerate(zip(content, out.token_ids, out.logprobs)):
            want_top = [(list(self.tok.token_bytes(x)), v) for x, v in zip(lp.top_ids, lp.top_logprobs)]
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
            ok = ok and all(g[k]["rank"] == r and self._close(g[k]["logprob"], v) for k, (v, r) in expect.items())
            if not ok:
                self._bad(item, f"prompt_logprobs[{i}]", g, expect)


def replay(results: list[Result], config: str, overrides: dict, tol: float, group: int, limit: int) -> Comparer:
    """Replays the first `limit` reproducible requests that completed (-1: all), `group` at a time."""
    rt = Runtime.from_yaml(config, overrides)
    comparer = Comparer(rt.tokenizer, tol)
    done = [r for r in results if r.spec.reproducible and r.outcome == "ok"]
    items = [it for r in done[: limit if limit >= 0 else None] for it in engine_inputs(r, rt.tokenizer)]
    for start in range(0, len(items), group):
        chunk = items[start : start + group]
        for item, out in zip(chunk, rt.generate([it.prompt for it in chunk], [it.params for it in chunk])):
            comparer.compare(item, out)
    return comparer
