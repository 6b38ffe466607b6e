"""Server-sent events for streamed responses: `data: {json}\n\n` per chunk, then `data: [DONE]`.

The engine requests are aborted when the stream ends early for any reason: a client that disconnects cancels
the generator (Starlette), whose `finally` aborts them, so their KV blocks are freed at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable

from fastapi.responses import StreamingResponse
from pydantic_core import to_json

from qwen3_runtime.server.choice import Choice
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.generation import Generation

DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    # pydantic's Rust encoder: the chunks' JSON is most of the API process's work per token. Its floats are
    # logprobs, made finite (or the request failed) by logprob_format.finite.
    return b"data: " + to_json(obj) + b"\n\n"


def stream_response(
    gen: Generation,
    first: Iterable[dict],
    chunk_for: Callable[[Choice], dict | None],
    usage_chunk: Callable[[], dict] | None,
) -> StreamingResponse:
    """`first` chunks, then chunk_for(choice) after each update (None: nothing to send), then the usage chunk."""

    async def events() -> AsyncIterator[bytes]:
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
