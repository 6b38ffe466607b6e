"""A limit on request bodies, enforced before anything parses them: a 413 in OpenAI's error shape."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qwen3_runtime.server.errors import APIError

DEFAULT_MAX_REQUEST_BYTES = 4 << 20  # a prompt of max_model_len token ids, as JSON, fits many times over


class BodyLimitMiddleware:
    """Reads each request's body first, at most `max_bytes` of it (by Content-Length, then by the bytes that
    arrive, so a chunked body cannot slip past), and replays it to the app; past the limit the client gets a 413
    and the rest is never read. Plain ASGI (as APIKeyMiddleware): after the replayed body, `receive` is the
    server's own, so the app still sees a disconnect."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        body = await self._read(receive)
        if body is None:
            return await self._too_large(scope, receive, send)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit (or the client left: nothing to answer)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"the request body is larger than the server's limit of {self.max_bytes} bytes (--max-request-bytes)"
        await APIError(message, status=413, kind="RequestTooLargeError").response()(scope, receive, send)
