"""The API process's side of the engine: starts the engine process and routes its step batches to per-request
asyncio queues.

A reader thread blocks on the engine's pipe and hands each StepBatch to the event loop, so the loop never waits
on the engine. When the engine process dies, every open request gets EngineDead, /health reports it, and the
`on_death` callback runs (launch.py stops the server: a dead engine is not restarted in place)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qwen3_runtime.params import SamplingParams
from qwen3_runtime.server.messages import AbortRequest, AddRequest, EngineStats, Failed, Ready, StepBatch
from qwen3_runtime.server.metrics import ServerMetrics

log = logging.getLogger("qwen3_runtime.server")

STARTUP_TIMEOUT_S = 600.0
# The engine's pipe reads EOF as its process exits, a moment before its exit status can be read.
EXIT_STATUS_WAIT_S = 5.0


class EngineDead(RuntimeError):
    """The engine process is gone: requests fail with 503 instead of waiting forever."""


class EngineStartError(RuntimeError):
    pass


@dataclass
class RequestStream:
    """Where one engine request's updates go (a queue an HTTP request may share among its choices), and its
    timing for the metrics."""

    queue: asyncio.Queue
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0
    finished: bool = False
    stopped: bool = False  # a stop string ended it: the client got "stop", whatever the engine says


class EngineClient:
    def __init__(self, config: str, overrides: dict[str, Any], metrics: ServerMetrics) -> None:
        self.config = config
        self.overrides = overrides
        self.metrics = metrics
        self.stats = EngineStats()
        self.dead = False
        self.death: str | None = None  # how the engine process ended, when it died while serving
        self.on_death: Callable[[], None] | None = None  # called on the event loop once it died while serving
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> Ready:
        """Spawn the engine process and wait until its Runtime is built (blocking: call before serving)."""
        ctx = mp.get_context("spawn")
        inbox, self._send_conn = ctx.Pipe(duplex=False)  # (read end, write end)
        self._recv_conn, outbox = ctx.Pipe(duplex=False)
        args = (self.config, self.overrides, inbox, outbox)
        self.proc = ctx.Process(target=_run_engine, args=args, name="qwen3-engine", daemon=True)
        self.proc.start()
        inbox.close(), outbox.close()  # the child's ends: reads here see EOF once it exits
        if not self._recv_conn.poll(STARTUP_TIMEOUT_S):
            raise EngineStartError(f"the engine did not start within {STARTUP_TIMEOUT_S:.0f} s")
        try:
            msg = self._recv_conn.recv()
        except EOFError:
            how = self._exit_status()
            raise EngineStartError(f"the engine process exited while starting ({how}; see its output above)") from None
        if isinstance(msg, Failed):
            raise EngineStartError(msg.message)
        return msg

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start routing the engine's messages into `loop` (the server's event loop)."""
        self._loop = loop
        threading.Thread(target=self._read, name="engine-reader", daemon=True).start()

    def shutdown(self) -> None:
        self.dead = True  # from here on its exit is expected, not an error to report
        self._send_conn.close()  # the engine sees EOF and returns
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc.is_alive()

    def new_id(self) -> str:
        return f"{next(self._ids)}"

    def add(
        self, request_id: str, prompt: list[int], params: SamplingParams, queue: asyncio.Queue, first: bool = True
    ) -> None:
        """Submit a checked request; its updates go to `queue`, which must have room for max_tokens + 3 of
        them (one per step that produced a token, the final one, EngineDead), so put_nowait never fails. first:
        the prompt's first choice (the metrics count a prompt once, as usage does)."""
        if not self.alive:
            raise EngineDead("the engine process is not running")
        self._streams[request_id] = RequestStream(queue)
        self._send(AddRequest(request_id, prompt, params))
        self.metrics.prompt_tokens.inc(len(prompt) if first else 0)

    def abort(self, request_id: str, stopped: bool = False) -> None:
        """End a request the client no longer wants: it disconnected, or (stopped) a stop string ended it."""
        stream = self._streams.get(request_id)
        if stream is not None and not stream.finished and self.alive:
            stream.finished, stream.stopped = True, stopped
            self._send(AbortRequest(request_id))

    def _send(self, msg: AddRequest | AbortRequest) -> None:
        try:
            self._send_conn.send(msg)
        except (OSError, ValueError) as e:  # the engine closed its end: the reader reports its death at EOF
            raise EngineDead("the engine process is not running") from e

    def _read(self) -> None:
        """The reader thread: one StepBatch at a time to the event loop, then, at EOF, the engine's death with
        its exit status."""
        while True:
            try:
                msg = self._recv_conn.recv()
            except (EOFError, OSError):
                break
            self._loop.call_soon_threadsafe(self._dispatch, msg)
        how = self._exit_status()
        self._loop.call_soon_threadsafe(self._on_dead, how)

    def _exit_status(self) -> str:
        """How the engine process ended, once it has (waiting for its exit status, which follows its pipe's EOF)."""
        self.proc.join(EXIT_STATUS_WAIT_S)
        return describe_exit(self.proc.exitcode)

    def _dispatch(self, batch: StepBatch) -> None:
        self.stats = batch.stats
        now = time.perf_counter()
        for up in batch.updates:
            stream = self._streams.get(up.request_id)
            if stream is None:
                continue
            self.metrics.observe_update(stream, up, now)
            if up.finish_reason is not None:
                del self._streams[up.request_id]
                stream.finished = True
            try:
                stream.queue.put_nowait(up)
            except asyncio.QueueFull:  # cannot happen (see add); never block the loop on it
                log.error("request %s: update queue full, update dropped", up.request_id)

    def _on_dead(self, how: str) -> None:
        unexpected = not self.dead  # not after shutdown()
        self.dead = True
        for stream in self._streams.values():
            stream.queue.put_nowait(EngineDead("the engine process died"))
        self._streams.clear()
        if unexpected:
            self.death = how
            log.error("the engine process died (%s): its requests fail and the server stops", how)
            if self.on_death is not None:
                self.on_death()


def describe_exit(exitcode: int | None) -> str:
    """A process's exit status in words: multiprocessing's negative exit code is the signal that killed it."""
    if exitcode is None:
        return "its pipe closed but the process is still running"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    return f"killed by {name}, exit code {exitcode}"


def _run_engine(*args: Any) -> None:
    """The engine process's entry point: engine_core (torch, Triton, the Runtime) is imported there alone, so the
    API process loads none of them."""
    from qwen3_runtime.server.engine_core import run_engine

    run_engine(*args)
