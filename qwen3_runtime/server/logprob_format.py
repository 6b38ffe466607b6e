"""Logprobs in OpenAI's two shapes (completions' parallel lists, chat's per-token objects) and vLLM's
prompt_logprobs. A -inf logprob (a token top-k / top-p filtered out, in processed mode) is written as -9999.0,
OpenAI's convention; NaN or +inf never reaches JSON: the request fails with a clear error instead."""

from __future__ import annotations

import math
from collections.abc import Sequence

from qwen3_runtime.logprobs import TokenLogprob
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.tokenizer import Tokenizer

NEG_INF_LOGPROB = -9999.0


def finite(x: float) -> float:
    if x == -math.inf:
        return NEG_INF_LOGPROB
    if not math.isfinite(x):
        raise APIError(f"the engine produced a logprob of {x}", status=500, kind="InternalServerError")
    return x


def completion_logprobs(
    tok: Tokenizer, ids: Sequence[int], lps: Sequence[TokenLogprob | None], offsets: Sequence[int]
) -> dict:
    """{tokens, token_logprobs, top_logprobs, text_offset}; an entry without logprobs (the prompt's first
    token, with echo) is null. Each top_logprobs holds the token itself first, then the top k: "up to logprobs + 1
    elements" (OpenAI's), as vLLM gives them."""
    tokens = tok.token_strings(ids)
    tops = []
    for token, lp in zip(tokens, lps):
        if lp is None:
            tops.append(None)
            continue
        top = {token: finite(lp.logprob)}
        for t, v in zip(tok.token_strings(lp.top_ids), lp.top_logprobs):
            top.setdefault(t, finite(v))  # two ids with one text: the first one's (the likelier of the top)
        tops.append(top)
    return {
        "tokens": tokens,
        "token_logprobs": [None if lp is None else finite(lp.logprob) for lp in lps],
        "top_logprobs": tops,
        "text_offset": list(offsets),
    }


def merge_completion_logprobs(first: dict, second: dict) -> dict:
    """The prompt's logprobs then the completion's (echo)."""
    return {key: first[key] + second[key] for key in first}


def chat_logprobs(tok: Tokenizer, ids: Sequence[int], lps: Sequence[TokenLogprob | None]) -> dict:
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    return {"content": [_chat_entry(tok, t, lp) for t, lp in zip(ids, lps) if lp is not None]}


def _chat_entry(tok: Tokenizer, token_id: int, lp: TokenLogprob) -> dict:
    top = [_token(tok, t, v) for t, v in zip(lp.top_ids, lp.top_logprobs)]
    return {**_token(tok, token_id, lp.logprob), "top_logprobs": top}


def _token(tok: Tokenizer, token_id: int, logprob: float) -> dict:
    raw = tok.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": finite(logprob), "bytes": list(raw)}


def prompt_logprobs(tok: Tokenizer, prompt: Sequence[int], lps: Sequence[TokenLogprob | None]) -> list:
    """vLLM's shape: per prompt token None or {token_id: {logprob, rank, decoded_token}}, the prompt's token
    first, then the top ones."""
    out: list[dict | None] = []
    for token_id, lp in zip(prompt, lps):
        if lp is None:
            out.append(None)
            continue
        entry = {str(token_id): _vllm_entry(tok, token_id, lp.logprob, lp.rank)}
        for rank, (t, v) in enumerate(zip(lp.top_ids, lp.top_logprobs), start=1):
            entry.setdefault(str(t), _vllm_entry(tok, t, v, rank))
        out.append(entry)
    return out


def _vllm_entry(tok: Tokenizer, token_id: int, logprob: float, rank: int) -> dict:
    return {"logprob": finite(logprob), "rank": rank, "decoded_token": tok.token_strings([token_id])[0]}
