"""Which KV cache blocks each sequence owns and, with prefix caching, which full blocks a later sequence with
the same leading tokens can reuse instead of recomputing their KV."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from qwen3_runtime.block_hash import extend_block_hashes
from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import Request


@dataclass(frozen=True)
class BlockStats:
    """A snapshot for metrics and tests: num_free + num_used + num_evictable == num_blocks."""

    num_blocks: int
    num_free: int  # no owner and no hash
    num_used: int  # held by at least one sequence
    num_evictable: int  # cached with no owner: a hit can take it back until it is evicted
    num_cached: int  # blocks with a registered hash, used or evictable
    query_tokens: int  # tokens of the requests allocate_prefix looked up
    hit_tokens: int  # of those, tokens whose KV came from the cache


class BlockManager:
    """Hands out cache blocks to sequences; a sequence owns blocks for every token it has cached.

    With `prefix_caching`, a full block whose KV is computed is registered under its chained hash
    (block_hash.py) and reference counted: sequences with the same leading tokens share it, and when none
    holds it, it stays cached (evictable, least recently released first) until a fresh block is needed and
    no uncached one is free."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.free: deque[int] = deque(range(num_blocks))  # no owner, no hash: taken first
        self.evictable: OrderedDict[int, None] = OrderedDict()  # hashed, no owner: least recently released first
        self._refs = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._block_of: dict[bytes, int] = {}
        self._num_offered: dict[int, int] = {}  # request id -> leading table blocks cache_blocks has seen
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """What a sequence can still be given: free blocks and evictable cached ones."""
        return len(self.free) + len(self.evictable)

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def block_hash(self, block: int) -> bytes | None:
        """The hash `block` is registered under, None when it is not cached."""
        return self._hash_of[block]

    def blocks_needed(self, req: Request, num_tokens: int | None = None) -> int:
        """Blocks `req` lacks to hold its first `num_tokens` tokens (default all: the next forward writes up
        to num_tokens)."""
        num_tokens = req.num_tokens if num_tokens is None else num_tokens
        return max(0, cdiv(num_tokens, self.block_size) - len(req.block_table))

    def can_grow(self, req: Request, num_tokens: int | None = None) -> bool:
        return self.blocks_needed(req, num_tokens) <= self.num_free_blocks

    def grow(self, req: Request, num_tokens: int | None = None) -> None:
        """Appends blocks up to `num_tokens` tokens: uncached free ones first, then the least recently
        released cached ones, which lose their hash."""
        needed = self.blocks_needed(req, num_tokens)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"request {req.request_id} needs {needed} blocks, {self.num_free_blocks} are free")
        for _ in range(needed):
            req.block_table.append(self._take())

    def cached_prefix(self, req: Request) -> list[int]:
        """The cached blocks of req's longest run of cached leading full blocks, stopping short of its last
        token (the forward must still produce that token's logits). Takes no reference."""
        if not self.prefix_caching:
            return []
        keys = extend_block_hashes(req, req.num_tokens, self.block_size)
        blocks = []
        for key in keys[: max(0, req.num_tokens - 1) // self.block_size]:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def can_admit(self, req: Request, num_tokens: int | None = None) -> bool:
        """Whether allocate_prefix(req) then grow(req, num_tokens) would succeed. The hit's evictable blocks
        are not counted as free: referencing them takes them off the evictable list."""
        hit = self.cached_prefix(req)
        num_tokens = req.num_tokens if num_tokens is None else num_tokens
        needed = max(0, cdiv(num_tokens, self.block_size) - len(req.block_table) - len(hit))
        return needed <= self.num_free_blocks - sum(self._refs[block] == 0 for block in hit)

    def allocate_prefix(self, req: Request) -> int:
        """At admission (req owns no block): req's table starts with its cached prefix, referenced. Returns
        how many tokens those blocks hold, whose KV the forward skips; 0 without prefix caching. A caller
        declining the hit (prompt logprobs need every position's logits) just does not call it."""
        if not self.prefix_caching:
            return 0
        if req.block_table:
            raise ValueError(f"request {req.request_id} already owns blocks")
        hit = self.cached_prefix(req)
        for block in hit:
            if self._refs[block] == 0:
                del self.evictable[block]
            self._refs[block] += 1
        req.block_table = hit
        self._num_offered[req.request_id] = len(hit)  # registered already
        num_cached = len(hit) * self.block_size
        if not req.preempted:  # a readmission finds its own blocks: not what the cache is for
            self.query_tokens += req.num_tokens
            self.hit_tokens += num_cached
        return num_cached

    def cache_blocks(self, req: Request, num_tokens_known: int) -> None:
        """Registers req's full blocks among its first `num_tokens_known` tokens for later requests to hit.
        Known means both: the KV is written (a forward ran over them) and the values are on the host (a
        block holding a PENDING slot waits for a later call). A block whose hash another block already holds
        (equal prompts computed together) stays unregistered and is freed as usual."""
        if not self.prefix_caching:
            return
        start = self._num_offered.get(req.request_id, 0)
        keys = extend_block_hashes(req, num_tokens_known, self.block_size)
        end = min(len(keys), len(req.block_table), num_tokens_known // self.block_size)
        for index in range(start, end):
            block, key = req.block_table[index], keys[index]
            if key not in self._block_of:
                self._hash_of[block] = key
                self._block_of[key] = block
        self._num_offered[req.request_id] = max(start, end)

    def release(self, req: Request) -> None:
        """Drops req's references (it finished, or is preempted): unshared cached blocks become evictable,
        the others free. Its block_hashes stay: they depend only on its tokens."""
        self._num_offered.pop(req.request_id, None)
        # Tail first into the LRU order, so evicted first: a hit needs an unbroken run of leading blocks, so an
        # evicted head block would leave every cached block after it unreachable.
        for block in reversed(req.block_table):
            self._refs[block] -= 1
            if self._refs[block] == 0 and self._hash_of[block] is not None:
                self.evictable[block] = None
        self.free.extend(block for block in req.block_table if self._refs[block] == 0 and self._hash_of[block] is None)
        req.block_table = []

    def _take(self) -> int:
        if self.free:
            block = self.free.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)
            del self._block_of[self._hash_of[block]]
            self._hash_of[block] = None
        self._refs[block] = 1
        return block

    def stats(self) -> BlockStats:
        free, evictable = len(self.free), len(self.evictable)
        return BlockStats(
            self.num_blocks,
            free,
            self.num_blocks - free - evictable,
            evictable,
            len(self._block_of),
            self.query_tokens,
            self.hit_tokens,
        )

    def check(self) -> BlockStats:
        """Asserts the bookkeeping is consistent (for tests): each block is free (no hash), used (referenced)
        or evictable (hashed), exactly one of them; hashes and blocks map one to one."""
        free, evictable = set(self.free), set(self.evictable)
        assert len(free) == len(self.free), "a block is twice in the free list"
        assert not free & evictable, "a block is both free and evictable"
        for block, (refs, key) in enumerate(zip(self._refs, self._hash_of)):
            assert refs >= 0, f"block {block} has {refs} references"
            if refs:
                assert block not in free and block not in evictable, f"used block {block} is listed as free"
            else:
                assert block in (free if key is None else evictable), f"unused block {block} is lost"
            assert key is None or self._block_of.get(key) == block, f"block {block}'s hash maps elsewhere"
        assert len(self._block_of) == sum(key is not None for key in self._hash_of), "a hash maps to no block"
        stats = self.stats()
        assert stats.num_used == sum(refs > 0 for refs in self._refs)
        return stats
