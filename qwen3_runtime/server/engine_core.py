"""The engine process: owns the Runtime and runs its step loop, so HTTP and JSON work never delays a step.

It reads AddRequest / AbortRequest messages between steps (blocking only when it has nothing to run) and sends
one StepBatch per step that produced tokens, and one (maybe empty) whenever it is idle, so /metrics shows the
state with no request left. It exits when the API process's end of the pipe closes."""

from __future__ import annotations

import logging
import signal
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from qwen3_runtime.heap import freeze_startup_objects
from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.runtime import Runtime
from qwen3_runtime.server.messages import (
    AbortRequest,
    AddRequest,
    EngineStats,
    Failed,
    Ready,
    StepBatch,
)
from qwen3_runtime.server.rss import rss_bytes

log = logging.getLogger("qwen3_runtime.server.engine")

# How stale /metrics' engine memory may be while it runs: reading /proc every step costs the step loop host
# time. Idle, it is read every time (the soak's leak check reads it then).
RSS_PERIOD_S = 0.5


def run_engine(config: str, overrides: dict[str, Any], inbox: Connection, outbox: Connection) -> None:
    """The child process's entry point (spawned: it imports torch afresh and shares no state)."""
    # A terminal's Ctrl+C and a service manager's stop (systemd's SIGTERM to the control group) reach this process
    # too. The API process shuts down (finishing what it serves) and then closes the pipe, which ends this loop;
    # stopped here, the engine would die under open requests and the server would report a dead engine.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        rt = Runtime.from_yaml(config, overrides)
    except Exception as e:  # a bad config or checkpoint: the API process reports it and exits
        outbox.send(Failed(f"{e}" if isinstance(e, ValueError) else traceback.format_exc()))
        return
    ready = Ready(rt.limits, rt.sampling_defaults, rt.summary)
    freeze_startup_objects()
    outbox.send(ready)
    EngineLoop(rt, inbox, outbox).run()


class EngineLoop:
    def __init__(self, rt: Runtime, inbox: Connection, outbox: Connection) -> None:
        self.rt = rt
        self.inbox = inbox
        self.outbox = outbox
        self.client_ids: dict[int, str] = {}  # the Runtime's id -> the API process's id
        self.engine_ids: dict[str, int] = {}
        self.rejected: list[RequestUpdate] = []
        self.rss, self.rss_read_at = 0, -RSS_PERIOD_S

    def run(self) -> None:
        self._publish()  # the stats before any request (/metrics' baseline)
        while self._receive(block=not self.rt.has_unfinished()):
            if self.rt.has_unfinished():
                self.rt.step()
            self._publish()

    def _receive(self, block: bool) -> bool:
        """Handle every message waiting (waiting for one when idle); False once the API process is gone."""
        try:
            if block:
                self.inbox.poll(None)
            while self.inbox.poll():
                self._handle(self.inbox.recv())
        except (EOFError, OSError):
            return False
        return True

    def _handle(self, msg: AddRequest | AbortRequest) -> None:
        if isinstance(msg, AddRequest):
            try:
                engine_id = self.rt.add_request(msg.prompt, msg.params, stream=True)
            except ValueError as e:
                self.rejected.append(RequestUpdate(msg.request_id, [], None, None, "rejected", str(e), len(msg.prompt)))
                return
            self.client_ids[engine_id] = msg.request_id
            self.engine_ids[msg.request_id] = engine_id
        elif isinstance(msg, AbortRequest):
            engine_id = self.engine_ids.get(msg.request_id)
            if engine_id is not None:
                self.rt.abort(engine_id)
        else:
            log.error("engine: unknown message %r", type(msg).__name__)

    def _publish(self) -> None:
        updates, self.rejected = self.rejected, []
        for up in self.rt.take_updates():  # fresh objects, renamed in place
            client_id = self.client_ids[up.request_id]
            if up.finish_reason is not None:
                del self.client_ids[up.request_id], self.engine_ids[client_id]
            up.request_id = client_id
            updates.append(up)
        if updates or not self.rt.has_unfinished():  # idle: the stats once it is, so /metrics is not stale
            self.outbox.send(StepBatch(updates, self._stats()))

    def _stats(self) -> EngineStats:
        now = time.monotonic()
        if now - self.rss_read_at >= RSS_PERIOD_S or not self.rt.has_unfinished():
            self.rss, self.rss_read_at = rss_bytes(), now
        sched = self.rt.scheduler
        gpu = torch.cuda.memory_allocated(self.rt.device) if self.rt.device.type == "cuda" else 0
        blocks = sched.blocks
        return EngineStats(
            len(sched.running) + len(sched.prefilling), len(sched.waiting), self.rt.stats,
            blocks.num_free_blocks, blocks.num_blocks, self.rss, gpu, sched.num_preemptions,
            blocks.query_tokens, blocks.hit_tokens,
        )  # fmt: skip
