"""The FastAPI app: OpenAI's routes, /health, /metrics, the API key, and errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from qwen3_runtime.server.chat import create_chat_completion
from qwen3_runtime.server.completions import create_completion
from qwen3_runtime.server.errors import APIError, engine_unavailable, validation_error
from qwen3_runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from qwen3_runtime.server.state import ServerState

OPEN_PATHS = frozenset({"/health"})  # answered without the API key (load balancers probe it)


def build_app(state: ServerState, api_key: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.client.attach(asyncio.get_running_loop())
        yield
        state.client.shutdown()

    app = FastAPI(title="qwen3_runtime", lifespan=lifespan)
    app.state.server = state
    _add_errors(app)
    if api_key is not None:
        _add_api_key(app, api_key)
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

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "qwen3_runtime"}
        return {"object": "list", "data": [{**card, "max_model_len": state.limits.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        _check_engine(state)
        return await create_completion(req, state)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest) -> Response:
        _check_engine(state)
        return await create_chat_completion(req, state)


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


def _add_api_key(app: FastAPI, api_key: str) -> None:
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "").encode()
            if not secrets.compare_digest(given, expected):
                error = APIError("invalid or missing API key", status=401, kind="AuthenticationError")
                return error.response()
        return await call_next(request)
