"""Continuous batching with chunked prefill: admit prompts while KV blocks allow, prefill them in chunks, the
running requests decoding in the same step (each a one-token chunk) within `max_num_batched_tokens` tokens a step
in all (as vLLM counts them), decode alone when no prompt is pending, preempt the newest admitted requests when
blocks run out."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from qwen3_runtime.block_manager import BlockManager
from qwen3_runtime.config import EngineConfig
from qwen3_runtime.request import PENDING, Request, Status


@dataclass
class PrefillChunk:
    """Tokens [start, end) of `req`, computed by one prefill forward; the last chunk samples the next token. A
    decoding request rides in a prefill step as the chunk of its last token."""

    req: Request
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def is_last(self) -> bool:
        return self.end == self.req.num_tokens


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []  # admitted, their prompts' KV partly computed
        self.running: list[Request] = []  # decoding
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def schedule(self, finishing: frozenset[int] = frozenset()) -> tuple[list[PrefillChunk] | list[Request], bool]:
        """The next batch and whether it is a prefill. While prompts are pending, the running requests decode
        inside the prefill step (a mixed batch, as vLLM's) and the prompts take the rest of its token budget, so
        none waits for more than one step of at most max_num_batched_tokens tokens between two of its tokens;
        otherwise a decode step. With batch_invariant every step is a prefill step, so every token goes through
        the same kernels. The budget is at least max_num_seqs (the config's rule), so the decoding rows always
        leave the prompts a token of it. `finishing`: as decode_batch's."""
        invariant = self.cfg.batch_invariant
        if not (invariant or self.prefill_due()):
            return self.decode_batch(finishing), False
        decoding = self.decode_batch(finishing)  # first: growing them may preempt, which frees blocks for prompts
        chunks = self._prefill_chunks(self.cfg.max_num_batched_tokens - len(decoding))
        if not (chunks or invariant):
            return decoding, False
        return [PrefillChunk(req, req.num_tokens - 1, req.num_tokens) for req in decoding] + chunks, True

    def prefill_due(self) -> bool:
        """Whether schedule() would prefill now."""
        return bool(self.prefilling) or self._admits_next()

    def finish(self, req: Request) -> None:
        """Also for a request preempted while its last step was still in flight (async scheduling)."""
        req.status = Status.FINISHED
        self._release(req)
        for queue in (self.running, self.prefilling, self.waiting):
            if req in queue:
                queue.remove(req)
                return

    def _admits_next(self) -> bool:
        """Whether the first waiting request can be admitted now: room, blocks, and all its tokens known (one
        preempted while its last step is in flight waits for that step's token; a constrained one, for its grammar)."""
        if not self.waiting or len(self.running) + len(self.prefilling) >= self.cfg.max_num_seqs:
            return False
        req = self.waiting[0]  # a constrained one waits for its grammar (compiled off the step loop)
        return not (req.output and req.output[-1] == PENDING or req.awaiting_grammar) and self._fits(req)

    def _fits(self, req: Request) -> bool:
        """Whether blocks for all of req's tokens can be had now (its cached prefix counted as its own)."""
        return self.blocks.can_admit(req) if self._reuses_prefix(req) else self.blocks.can_grow(req)

    def _reuses_prefix(self, req: Request) -> bool:
        # Prompt logprobs need the logits of every prompt position: a request asking for them computes its
        # whole prompt, cached or not.
        return not req.needs_prompt_logprobs

    def _prefill_chunks(self, budget: int) -> list[PrefillChunk]:
        """Chunks of the prompts being prefilled, then of newly admitted ones, up to `budget` tokens in all.
        A request gets blocks for all its tokens when admitted, so a prefill never waits for blocks midway."""
        chunks = []
        for req in self.prefilling:
            if budget <= 0:
                break
            chunks.append(self._chunk(req, budget))
            budget -= chunks[-1].num_tokens
        while budget > 0 and self._admits_next():
            req = self.waiting.popleft()
            req.num_computed_tokens = self.blocks.allocate_prefix(req) if self._reuses_prefix(req) else 0
            self.blocks.grow(req)
            req.status = Status.RUNNING
            self.prefilling.append(req)
            chunks.append(self._chunk(req, budget))
            budget -= chunks[-1].num_tokens
        for chunk in chunks:  # scheduled: their KV counts as computed, so later requests may reuse it
            chunk.req.num_computed_tokens = chunk.end
            self.blocks.cache_blocks(chunk.req, chunk.end)
            if chunk.is_last:
                self.prefilling.remove(chunk.req)
                self.running.append(chunk.req)
        return chunks

    @staticmethod
    def _chunk(req: Request, budget: int) -> PrefillChunk:
        start = req.num_computed_tokens
        return PrefillChunk(req, start, min(req.num_tokens, start + budget))

    def decode_batch(self, finishing: frozenset[int] = frozenset()) -> list[Request]:
        """Every running request gets a slot for its next token; the newest requests, decoding or still
        prefilling, are preempted to make room. `finishing`: ids of requests known to end with the step in
        flight, left out; their blocks come free once it is read, so a request short of blocks while they hold
        some waits a step rather than preempt itself."""
        batch = []
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.request_id in finishing:  # preempted below, or ending
                continue
            if self.blocks.blocks_needed(req) == 0:  # most steps: its last block has room
                batch.append(req)
                continue
            while not self.blocks.can_grow(req) and (victim := self._newest_after(req, finishing)):
                self._preempt(victim)
            if self.blocks.can_grow(req):
                self.blocks.grow(req)
                batch.append(req)
            elif not any(r.request_id in finishing for r in self.running):
                self._preempt(req)
        return batch

    def _newest_after(self, req: Request, finishing: frozenset[int]) -> Request | None:
        """The next to preempt for req: the newest admitted request that arrived after it and is not ending."""
        later = (r for r in self.running + self.prefilling if r.request_id > req.request_id)
        return max((r for r in later if r.request_id not in finishing), key=lambda r: r.request_id, default=None)

    def _preempt(self, req: Request) -> None:
        """Free its blocks (full ones stay cached) and queue it first; it is recomputed from its tokens (or
        its cached prefix) when readmitted, its prompt logprobs too."""
        self._release(req)
        (self.prefilling if req in self.prefilling else self.running).remove(req)
        req.status = Status.WAITING
        req.num_computed_tokens = 0
        req.prompt_logprob_parts = []
        req.preempted = True
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def _release(self, req: Request) -> None:
        """Free req's blocks; the full ones whose KV is written stay cached for requests that share them."""
        if req in self.prefilling:
            written = req.num_computed_tokens
        else:  # decoding: up to its last known token (an output slot not read yet holds PENDING), whose own
            # KV the next step writes
            known = req.output.index(PENDING) if PENDING in req.output else len(req.output)
            written = len(req.prompt) + known - 1
        self.blocks.cache_blocks(req, written)
        self.blocks.release(req)
