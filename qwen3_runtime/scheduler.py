"""Continuous batching: admit prompts while KV blocks allow, decode the running ones, preempt when full."""

from __future__ import annotations

from collections import deque

from qwen3_runtime.config import EngineConfig
from qwen3_runtime.kv_cache import BlockManager
from qwen3_runtime.sequence import Sequence, Status


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The next batch and whether it is a prefill. Prefill first, so new requests join soon."""
        batch = self._admit()
        if batch:
            return batch, True
        return self.decode_batch(), False

    def can_admit(self) -> bool:
        """Whether schedule() would prefill now."""
        if not self.waiting or len(self.running) >= self.cfg.max_num_seqs:
            return False
        seq = self.waiting[0]
        return seq.num_tokens <= self.cfg.max_num_batched_tokens and self.blocks.can_grow(seq)

    def finish(self, seq: Sequence) -> None:
        """Also for a sequence preempted while its last step was still in flight (async scheduling)."""
        seq.status = Status.FINISHED
        self.blocks.release(seq)
        (self.running if seq in self.running else self.waiting).remove(seq)

    def _admit(self) -> list[Sequence]:
        batch: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if tokens + seq.num_tokens > self.cfg.max_num_batched_tokens or not self.blocks.can_grow(seq):
                break
            self.waiting.popleft()
            self.blocks.grow(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append(seq)
            tokens += seq.num_tokens
        return batch

    def decode_batch(self, finishing: frozenset[int] = frozenset()) -> list[Sequence]:
        """Every running sequence gets a slot for its next token; the newest are preempted to make room.
        `finishing`: ids of sequences known to end with the step in flight, left out."""
        batch = []
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or id(seq) in finishing:  # preempted below, or ending
                continue
            if self.blocks.blocks_needed(seq) == 0:  # most steps: its last block has room
                batch.append(seq)
                continue
            while not self.blocks.can_grow(seq) and self.running[-1] is not seq:
                self._preempt(self.running[-1])
            if self.blocks.can_grow(seq):
                self.blocks.grow(seq)
                batch.append(seq)
            else:
                self._preempt(seq)
        return batch

    def _preempt(self, seq: Sequence) -> None:
        """Free its blocks and queue it first; it is recomputed from its tokens when readmitted."""
        self.blocks.release(seq)
        self.running.remove(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
