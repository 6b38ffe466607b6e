"""The FastAPI app: OpenAI's routes, /health, /metrics, the API key, and errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from qwen3_runtime.server.body_limit import DEFAULT_MAX_REQUEST_BYTES, BodyLimitMiddleware
from qwen3_runtime.server.chat import create_chat_completion
from qwen3_runtime.server.completions import create_completion
from qwen3_runtime.server.errors import APIError, body_not_utf8, engine_unavailable, validation_error
from qwen3_runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from qwen3_runtime.server.state import ServerState
from qwen3_runtime.server.tokenization import detokenize, tokenize
from qwen3_runtime.server.tokenize_protocol import DetokenizeRequest, TokenizeRequest
from qwen3_runtime.version import package_version

# The API key guards OpenAI's routes only, as vLLM's: /health, /metrics (Prometheus scrapers carry no key), /version
# and the tokenizer's routes answer without it.
GUARDED_PREFIX = "/v1/"
DISCONNECT_POLL_S = 0.2
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away (nobody reads it)


def build_app(
    state: ServerState, api_key: str | None = None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.client.attach(asyncio.get_running_loop())
        yield
        state.client.shutdown()

    app = FastAPI(title="qwen3_runtime", lifespan=lifespan)
    app.state.server = state
    _add_errors(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if api_key is not None:  # added last, so it runs first: no body is read for a client without the key
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    _add_routes(app, state)
    return app


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        """200 while the engine process runs; 503 once it died (the server cannot recover it)."""
        return Response(status_code=200 if state.client.alive else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    card = {
        "id": state.model_name,
        "object": "model",
        "created": int(time.time()),  # the server's start
        "owned_by": "qwen3_runtime",
        "max_model_len": state.limits.max_model_len,
    }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        """OpenAI's model retrieval (the openai client's models.retrieve)."""
        _check_model(state, model)
        return card

    @app.get("/version")
    async def version() -> dict:
        return {"version": package_version()}

    @app.post("/tokenize")
    async def tokenize_route(req: TokenizeRequest) -> dict:
        _check_model(state, req.model)
        return tokenize(req, state)

    @app.post("/detokenize")
    async def detokenize_route(req: DetokenizeRequest) -> dict:
        _check_model(state, req.model)
        return detokenize(req, state)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        _check_model(state, req.model)
        _check_engine(state)
        return await _unless_disconnected(request, create_completion(req, state))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request) -> Response:
        _check_model(state, req.model)
        _check_engine(state)
        return await _unless_disconnected(request, create_chat_completion(req, state))


async def _unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """`work` as a task, cancelled when the client disconnects: a response that is not streamed would otherwise
    generate to its end for nobody. Cancelling Generation.complete aborts its engine requests (streamed ones are
    aborted by sse.py once their response is returned)."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return Response(status_code=CLIENT_CLOSED)
        return task.result()
    finally:
        task.cancel()  # a no-op once done; else this handler itself was cancelled (shutdown)


def _check_model(state: ServerState, model: str | None) -> None:
    """A request for another model is a 404, as vLLM's (no model named: this one)."""
    if model is not None and model != state.model_name:
        raise APIError(f"The model '{model}' does not exist", "model", status=404, kind="NotFoundError")


def _check_engine(state: ServerState) -> None:
    if not state.client.alive:
        raise engine_unavailable()


def _add_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error(list(e.errors())).response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        """Starlette's own errors (404, 405, a body FastAPI could not parse) in OpenAI's shape too."""
        if isinstance(e.__cause__, UnicodeDecodeError):  # json.loads could not decode the body
            return body_not_utf8(e.__cause__).response()
        kind = "BadRequestError" if e.status_code == 400 else "NotFoundError" if e.status_code == 404 else "APIError"
        return APIError(str(e.detail), status=e.status_code, kind=kind).response()


class APIKeyMiddleware:
    """A 401 for a request to /v1/* without `Bearer <api_key>`. Plain ASGI, not @app.middleware("http"): Starlette's
    BaseHTTPMiddleware hides the client's disconnect from Request.is_disconnected, which _unless_disconnected
    relies on."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED_PREFIX):
            given = Headers(scope=scope).get("authorization", "").encode()
            if not secrets.compare_digest(given, self.expected):
                error = APIError("invalid or missing API key", status=401, kind="AuthenticationError")
                return await error.response()(scope, receive, send)
        await self.app(scope, receive, send)
