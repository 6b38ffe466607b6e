"""Continuous batching: admit prompts while KV blocks allow, decode the running ones, preempt when full."""

from __future__ import annotations

from collections import deque

from qwen3_runtime.block_manager import BlockManager
from qwen3_runtime.config import EngineConfig
from qwen3_runtime.request import Request, Status


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Request], bool]:
        """The next batch and whether it is a prefill. Prefill first, so new requests join soon."""
        batch = self._admit()
        if batch:
            return batch, True
        return self.decode_batch(), False

    def can_admit(self) -> bool:
        """Whether schedule() would prefill now."""
        if not self.waiting or len(self.running) >= self.cfg.max_num_seqs:
            return False
        req = self.waiting[0]
        return req.num_tokens <= self.cfg.max_num_batched_tokens and self.blocks.can_grow(req)

    def finish(self, req: Request) -> None:
        """Also for a sequence preempted while its last step was still in flight (async scheduling)."""
        req.status = Status.FINISHED
        self.blocks.release(req)
        (self.running if req in self.running else self.waiting).remove(req)

    def _admit(self) -> list[Request]:
        batch: list[Request] = []
        tokens = 0
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            if tokens + req.num_tokens > self.cfg.max_num_batched_tokens or not self.blocks.can_grow(req):
                break
            self.waiting.popleft()
            self.blocks.grow(req)
            req.status = Status.RUNNING
            self.running.append(req)
            batch.append(req)
            tokens += req.num_tokens
        return batch

    def decode_batch(self, finishing: frozenset[int] = frozenset()) -> list[Request]:
        """Every running sequence gets a slot for its next token; the newest are preempted to make room.
        `finishing`: ids of requests known to end with the step in flight, left out."""
        batch = []
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.request_id in finishing:  # preempted below, or ending
                continue
            if self.blocks.blocks_needed(req) == 0:  # most steps: its last block has room
                batch.append(req)
                continue
            while not self.blocks.can_grow(req) and self.running[-1] is not req:
                self._preempt(self.running[-1])
            if self.blocks.can_grow(req):
                self.blocks.grow(req)
                batch.append(req)
            else:
                self._preempt(req)
        return batch

    def _preempt(self, req: Request) -> None:
        """Free its blocks and queue it first; it is recomputed from its tokens when readmitted."""
        self.blocks.release(req)
        self.running.remove(req)
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1
