"""The engine requests of one HTTP request (n choices per prompt): submitted together, their updates merged
into one queue, and all aborted if the client goes away before they finish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from qwen3_runtime.server.choice import Choice, TextOptions
from qwen3_runtime.server.engine_client import EngineClient, EngineDead
from qwen3_runtime.server.errors import APIError, engine_unavailable
from qwen3_runtime.server.inputs import EngineInput
from qwen3_runtime.tokenizer import Tokenizer


class Generation:
    def __init__(self, client: EngineClient, tok: Tokenizer, inputs: list[EngineInput], options: TextOptions) -> None:
        self.client = client
        self.inputs = inputs
        self.choices = [
            Choice(i, tok, options, x.params.stop_token_ids, x.params.ignore_eos) for i, x in enumerate(inputs)
        ]
        self.ids = [client.new_id() for _ in inputs]
        self._by_id = dict(zip(self.ids, self.choices))
        self._queue: asyncio.Queue = asyncio.Queue(sum(x.params.max_tokens + 3 for x in inputs))
        self._open = set(self.ids)

    def start(self) -> None:
        try:
            counted = set()
            for request_id, x in zip(self.ids, self.inputs):
                self.client.add(request_id, x.prompt, x.params, self._queue, first=x.prompt_index not in counted)
                counted.add(x.prompt_index)
        except EngineDead:
            self.abort()
            raise engine_unavailable() from None

    async def updates(self) -> AsyncIterator[Choice]:
        """Each choice as an update reaches it, until every engine request has ended."""
        while self._open:
            up = await self._queue.get()
            if isinstance(up, EngineDead):
                self.abort()
                raise engine_unavailable()
            if up.finish_reason == "rejected":
                self.abort()
                raise APIError.from_value_error(ValueError(up.error))
            choice = self._by_id[up.request_id]
            if choice.apply(up):  # a stop string: the engine need not go on
                self.client.abort(up.request_id, stopped=True)
            if up.finish_reason is not None:
                self._open.discard(up.request_id)
            yield choice

    async def complete(self) -> list[Choice]:
        """Every choice to its end, for a response that is not streamed. A choice the engine failed (non-finite
        logits) raises a clear 500 for this request; the server and the other requests go on."""
        try:
            async for _ in self.updates():
                pass
        finally:
            self.abort()
        for c in self.choices:
            if c.finish_reason == "error":
                raise APIError(f"the request failed in the engine: {c.error}", status=500, kind="InternalServerError")
        return self.choices

    def abort(self) -> None:
        """Abort what has not finished (the client disconnected, or another choice failed)."""
        for request_id in self._open:
            self.client.abort(request_id)

    def usage(self) -> dict:
        """Each prompt counted once (as vLLM and OpenAI do with n > 1), every choice's tokens."""
        prompts = {x.prompt_index: len(x.prompt) for x in self.inputs}
        prompt_tokens = sum(prompts.values())
        completion_tokens = sum(len(c.token_ids) for c in self.choices)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
