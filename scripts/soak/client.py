"""Sends one Spec and records what came back: the choices (assembled from the chunks when streamed), the
timings, and the outcome. A request that outlives its deadline is "hung"."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from scripts.soak.workload import Spec


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    logprobs: dict | None = None  # completions: {tokens, token_logprobs, top_logprobs}; chat: {content: [...]}
    prompt_logprobs: list | None = None


@dataclass
class Result:
    spec: Spec
    outcome: str = "ok"  # ok | error | disconnected | aborted | rejected | hung | incomplete | unexpected
    status: int | None = None
    detail: str = ""
    error_param: str | None = None
    choices: dict[int, Choice] = field(default_factory=dict)
    ttft: float | None = None
    e2e: float | None = None
    completion_tokens: int = 0


def _merge_logprobs(c: Choice, lp: dict | None) -> None:
    if lp is None:
        return
    if c.logprobs is None:
        c.logprobs = {k: [] for k in lp}
    for k, v in lp.items():
        c.logprobs.setdefault(k, []).extend(v or [])


def take_choice(res: Result, ch: dict, chat: bool) -> None:
    """Adds a choice (whole) or a chunk's piece of one (streamed) to the result."""
    c = res.choices.setdefault(ch["index"], Choice())
    text = (ch.get("message") or ch.get("delta") or {}).get("content") if chat else ch.get("text")
    c.text += text or ""
    _merge_logprobs(c, ch.get("logprobs"))
    if ch.get("prompt_logprobs") is not None:
        c.prompt_logprobs = ch["prompt_logprobs"]
    if ch.get("finish_reason") is not None:
        c.finish_reason = ch["finish_reason"]


def _error(res: Result, body: dict) -> None:
    err = body.get("error") or {}
    res.outcome = "rejected" if res.status == 400 else "error"
    res.detail = f"{err.get('param')}: {err.get('message')}"
    res.error_param = err.get("param")


async def _stream(client: httpx.AsyncClient, res: Result, url: str, t0: float) -> None:
    spec, chat, chunks = res.spec, res.spec.route == "chat", 0
    async with client.stream("POST", url, json=spec.body) as r:
        res.status = r.status_code
        if r.status_code != 200:
            return _error(res, json.loads(await r.aread()))
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return
            if spec.fault == "disconnect" and chunks >= spec.after:
                res.outcome = "disconnected"
                return  # leaving the block closes the connection mid-stream
            chunks += 1
            body = json.loads(line[6:])
            if "error" in body:
                return _error(res, body)
            for ch in body.get("choices", []):
                if res.ttft is None and ((ch.get("delta") or {}).get("content") or ch.get("text")):
                    res.ttft = time.perf_counter() - t0
                take_choice(res, ch, chat)
            if body.get("usage"):
                res.completion_tokens = body["usage"]["completion_tokens"]
    res.outcome = "incomplete"  # the stream ended without [DONE]


async def _whole(client: httpx.AsyncClient, res: Result, url: str) -> None:
    spec = res.spec
    timeout = spec.after if spec.fault == "abort" else client.timeout
    try:
        r = await client.post(url, json=spec.body, timeout=timeout)
    except httpx.TimeoutException:
        if spec.fault != "abort":
            raise
        res.outcome = "aborted"
        return
    res.status = r.status_code
    body = r.json()
    if r.status_code != 200:
        return _error(res, body)
    for ch in body["choices"]:
        take_choice(res, ch, spec.route == "chat")
    res.completion_tokens = body["usage"]["completion_tokens"]


async def send(client: httpx.AsyncClient, spec: Spec, deadline_s: float) -> Result:
    res = Result(spec)
    url = "/v1/chat/completions" if spec.route == "chat" else "/v1/completions"
    t0 = time.perf_counter()
    try:
        run = _stream(client, res, url, t0) if spec.stream else _whole(client, res, url)
        await asyncio.wait_for(run, deadline_s)
    except asyncio.TimeoutError:
        res.outcome, res.detail = "hung", f"no complete response within {deadline_s} s"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        res.outcome, res.detail = "unexpected", f"{type(e).__name__}: {e}"
    res.e2e = time.perf_counter() - t0
    if res.outcome == "ok" and spec.bad_param:
        res.outcome, res.detail = "unexpected", f"status {res.status} for a bad {spec.bad_param}"
    elif res.outcome == "ok" and any(c.finish_reason is None for c in res.choices.values()):
        res.outcome, res.detail = "incomplete", "a choice without finish_reason"
    elif res.outcome == "ok" and len(res.choices) != spec.body.get("n", 1):
        res.outcome, res.detail = "incomplete", f"{len(res.choices)} choices of {spec.body.get('n', 1)}"
    return res
