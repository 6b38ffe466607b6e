"""`qwen3-runtime serve`: listen, start the engine process, then serve the app with uvicorn until interrupted or
until the engine process dies."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import uvicorn

from qwen3_runtime.config import load_config
from qwen3_runtime.heap import freeze_startup_objects
from qwen3_runtime.server.body_limit import DEFAULT_MAX_REQUEST_BYTES
from qwen3_runtime.server.chat_output import ChatParsers
from qwen3_runtime.server.engine_client import EngineClient
from qwen3_runtime.server.inputs import DEFAULT_MAX_CHOICES
from qwen3_runtime.server.metrics import ServerMetrics
from qwen3_runtime.server.openai_api import build_app
from qwen3_runtime.server.state import ServerState
from qwen3_runtime.tokenizer import load_tokenizer

# After the engine died, how long clients that do not read their responses may hold the server's exit.
DEATH_GRACE_S = 5.0


class ListenError(Exception):
    """The server cannot listen on the address it was given (a port in use, a host that is not this machine's)."""


class EngineDiedError(Exception):
    """The engine process died while serving: the server stopped, so that a supervisor restarts it."""


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine starts, so a bad address fails at once rather than after the
    model has loaded and its graphs are captured."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except OSError:
            sock.close()
            raise
    except OSError as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    return sock


def serve(
    config: str,
    overrides: dict[str, Any],
    host: str,
    port: int,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    served_model_name: str | None = None,
    max_choices: int = DEFAULT_MAX_CHOICES,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
) -> None:
    """served_model_name: the model's name in the API (default: the config's); max_choices: the most choices
    (prompts x n) one request may ask for; reasoning_parser ("qwen3"), tool_call_parser ("hermes"): how chat answers
    are split into thinking, content and tool calls (None: all content). Raises ConfigError for a bad config,
    CheckpointError for a tokenizer without a parser's tags, ListenError for an address it cannot listen on,
    EngineStartError when the engine cannot build the Runtime, EngineDiedError once the engine process died while
    serving."""
    tokenizer = load_tokenizer(load_config(config, overrides).model)  # checks the config before a spawn
    tokenizer.load_token_tables()
    parsers = ChatParsers.of(tokenizer, reasoning_parser, tool_call_parser)
    with listen(host, port) as sock:
        metrics = ServerMetrics()
        client = EngineClient(config, overrides, metrics)
        ready = client.start()
        print(f"INFO:     engine ready: {ready.summary}", flush=True)
        if ready.sampling_defaults:  # vLLM warns too: a request's defaults are not OpenAI's
            shown = ", ".join(f"{k}={v}" for k, v in ready.sampling_defaults.items())
            print(
                f"INFO:     requests default to the checkpoint's generation_config.json: {shown} "
                "(--set model.generation_config=neutral ignores it)",
                flush=True,
            )
        metrics.attach_engine(lambda: client.stats)
        state = ServerState(
            client,
            tokenizer,
            served_model_name or (Path(config).stem if config.endswith((".yaml", ".yml")) else config),
            ready.limits,
            ready.sampling_defaults,
            metrics,
            max_choices,
            parsers,
        )
        app = build_app(state, api_key, max_request_bytes)
        freeze_startup_objects()
        shown_host = f"[{host}]" if ":" in host else host
        print(f"INFO:     serving on http://{shown_host}:{sock.getsockname()[1]} (Press CTRL+C to quit)", flush=True)
        server = uvicorn.Server(uvicorn.Config(app, log_level="info"))
        client.on_death = lambda: stop(server)
        try:
            server.run(sockets=[sock])
        finally:
            client.shutdown()
        if client.death is not None:
            raise EngineDiedError(f"the engine process died ({client.death}): the server stopped")


def stop(server: uvicorn.Server) -> None:
    """vLLM's answer to a dead engine: stop serving, so the process exits and a supervisor restarts it. The requests
    in flight have their error already and finish first, for at most DEATH_GRACE_S."""
    server.should_exit = True
    asyncio.get_running_loop().call_later(DEATH_GRACE_S, setattr, server, "force_exit", True)
