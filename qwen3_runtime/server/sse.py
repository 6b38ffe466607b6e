"""Server-sent events for streamed responses: `data: {json}\n\n` per chunk, then `data: [DONE]`.

The engine requests are aborted when the stream ends early for any reason: a client that disconnects cancels
the generator (Starlette), whose `finally` aborts them, so their KV blocks are freed at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable

from fastapi.responses import StreamingResponse

from qwen3_runtime.server.choice import Choice
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.generation import Generation

DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    # allow_nan=False: a NaN that escaped the checks fails loudly here rather than as invalid JSON downstream.
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False)}\n\n"


def stream_response(
    gen: Generation,
    first: Iterable[dict],
    chunk_for: Callable[[Choice], dict | None],
    usage_chunk: Callable[[], dict] | None,
) -> StreamingResponse:
    """`first` chunks, then chunk_for(choice) after each update (None: nothing to send), then the usage chunk."""

    async def events() -> AsyncIterator[str]:
        try:
            for chunk in first:
                yield sse(chunk)
            async for choice in gen.updates():
                chunk = chunk_for(choice)
                if chunk is not None:
                    yield sse(chunk)
            if usage_chunk is not None:
                yield sse(usage_chunk())
            yield DONE
        except APIError as e:
            yield sse(e.body())
            yield DONE
        finally:
            gen.abort()

    return StreamingResponse(events(), media_type="text/event-stream")
