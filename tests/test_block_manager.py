import copy
from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from qwen3_runtime import SamplingParams, block_hash
from qwen3_runtime.block_hash import ROOT, hash_block
from qwen3_runtime.block_manager import BlockManager
from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import PENDING, Request


def _request(request_id: int, num_tokens: int) -> Request:
    return Request(request_id, [1] * num_tokens, SamplingParams(), seed=0)


def test_blocks_cover_every_token_and_go_back_on_release():
    blocks = BlockManager(num_blocks=4, block_size=4)
    req = _request(0, 5)
    assert blocks.blocks_needed(req) == 2 and blocks.can_grow(req)
    blocks.grow(req)
    assert req.block_table == [0, 1] and blocks.blocks_needed(req) == 0 and len(blocks.free) == 2
    req.output += [7, 7, 7]  # 8 tokens: still two blocks
    assert blocks.blocks_needed(req) == 0
    req.output.append(7)
    assert blocks.blocks_needed(req) == 1
    big = _request(1, 13)
    assert blocks.blocks_needed(big) == 4 and not blocks.can_grow(big)
    blocks.release(req)
    assert req.block_table == [] and sorted(blocks.free) == [0, 1, 2, 3] and blocks.can_grow(big)


# Each op: (request index, tokens to add, release it).
OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 20), st.booleans()), max_size=40)


@settings(max_examples=150, deadline=None, database=None)
@given(num_blocks=st.integers(1, 12), block_size=st.integers(1, 8), ops=OPS)
def test_blocks_are_never_lost_or_shared(num_blocks, block_size, ops):
    blocks = BlockManager(num_blocks, block_size)
    reqs = [_request(i, 1) for i in range(5)]
    for index, new_tokens, release in ops:
        req = reqs[index]
        if release:
            blocks.release(req)
            continue
        req.output += [0] * new_tokens
        if blocks.can_grow(req):
            blocks.grow(req)
            assert len(req.block_table) == cdiv(req.num_tokens, block_size)
        owned = [b for r in reqs for b in r.block_table]
        assert sorted(owned + list(blocks.free)) == list(range(num_blocks))  # each block once: free or owned
        assert blocks.check().num_used == len(owned)


# Prefix caching, over blocks of 4 tokens.
BS = 4


def _prompt(request_id: int, tokens: list[int]) -> Request:
    return Request(request_id, list(tokens), SamplingParams(), seed=0)


def _prefill(blocks: BlockManager, req: Request) -> int:
    """Admission as the scheduler and runner do it: the hit, blocks for the rest, the forward, registration."""
    assert blocks.can_admit(req)
    hit = blocks.allocate_prefix(req)
    blocks.grow(req)
    blocks.cache_blocks(req, req.num_tokens)
    blocks.check()
    return hit


def test_a_shared_prefix_hits_its_full_blocks_only():
    blocks = BlockManager(16, BS, prefix_caching=True)
    shared = list(range(10))  # two and a half blocks
    a, b = _prompt(0, shared + [100, 101]), _prompt(1, shared + [200, 201, 202, 203, 204, 205])
    assert _prefill(blocks, a) == 0
    assert _prefill(blocks, b) == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [blocks.refcount(block) for block in b.block_table] == [2, 2, 1, 1]
    stats = blocks.check()
    assert (stats.query_tokens, stats.hit_tokens, stats.num_cached) == (12 + 16, 8, 3 + 2)


def test_a_readmitted_request_finding_its_own_blocks_is_not_counted_as_a_hit():
    blocks = BlockManager(16, BS, prefix_caching=True)
    a = _prompt(0, range(10))
    _prefill(blocks, a)
    blocks.release(a)  # preempted: its full blocks stay cached
    a.preempted = True
    assert _prefill(blocks, a) == 8
    stats = blocks.check()
    assert (stats.query_tokens, stats.hit_tokens) == (10, 0)


def test_the_last_token_is_always_recomputed():
    blocks = BlockManager(16, BS, prefix_caching=True)
    a = _prompt(0, range(12))  # exactly three blocks, all cached after its prefill
    _prefill(blocks, a)
    same = _prompt(1, range(12))
    assert _prefill(blocks, same) == 8  # its last token needs logits: the third block is computed again
    assert same.block_table[:2] == a.block_table[:2] and same.block_table[2] != a.block_table[2]
    assert blocks.block_hash(same.block_table[2]) is None  # a's block holds that hash already
    longer = _prompt(2, list(range(12)) + [100])
    assert _prefill(blocks, longer) == 12 and longer.block_table[:3] == a.block_table


def test_a_block_hits_only_after_the_same_prefix():
    blocks = BlockManager(16, BS, prefix_caching=True)
    _prefill(blocks, _prompt(0, [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert _prefill(blocks, _prompt(1, [9, 9, 9, 9, 5, 6, 7, 8, 9])) == 0  # same second block, other first
    assert _prefill(blocks, _prompt(2, [1, 2, 3, 4, 9, 9, 9, 9, 9])) == 4
    assert _prefill(blocks, _prompt(3, [5, 6, 7, 8, 1, 2, 3, 4, 9])) == 0  # the blocks swapped


def test_cached_blocks_are_evicted_least_recently_released_first_tails_first():
    blocks = BlockManager(4, BS, prefix_caching=True)
    a, b = _prompt(0, range(8)), _prompt(1, range(50, 58))
    _prefill(blocks, a)
    _prefill(blocks, b)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    blocks.release(a)
    blocks.release(b)
    assert list(blocks.evictable) == [1, 0, 3, 2] and not blocks.free and blocks.num_free_blocks == 4
    c = _prompt(2, range(90, 93))
    _prefill(blocks, c)  # no block free: a's tail is evicted
    assert c.block_table == [1] and blocks.block_hash(1) is None and list(blocks.evictable) == [0, 3, 2]
    again = _prompt(3, range(8))
    assert _prefill(blocks, again) == 4  # a's first block is still cached, its second is not
    assert again.block_table == [0, 3] and list(blocks.evictable) == [2]  # b's tail went first
    assert blocks.block_hash(3) == again.block_hashes[1]  # the hash a's second block had, registered again
    blocks.release(again)  # its hit block is now among the most recently released
    assert list(blocks.evictable) == [2, 3, 0]
    stats = blocks.check()
    assert (stats.num_free, stats.num_used, stats.num_evictable) == (0, 1, 3)


def test_a_shared_block_stays_used_until_its_last_sharer_releases_it():
    blocks = BlockManager(8, BS, prefix_caching=True)
    reqs = [_prompt(i, list(range(8)) + [100 + i]) for i in range(3)]
    for i, req in enumerate(reqs):
        assert _prefill(blocks, req) == (0 if i == 0 else 8)
        assert [blocks.refcount(block) for block in reqs[0].block_table[:2]] == [i + 1] * 2
    shared = reqs[0].block_table[:2]
    assert blocks.num_free_blocks == 8 - 2 - 3
    for i, req in enumerate(reqs):
        blocks.release(req)
        stats = blocks.check()
        assert [blocks.refcount(block) for block in shared] == [2 - i] * 2
        assert stats.num_used == 2 * (i < 2) + 2 - i and stats.num_evictable == 2 * (i == 2)
    assert blocks.num_free_blocks == 8 and blocks.check().num_cached == 2


def test_a_preempted_request_hits_its_own_blocks_without_hashing_again(monkeypatch):
    blocks = BlockManager(8, BS, prefix_caching=True)
    req = _prompt(0, range(9))
    _prefill(blocks, req)
    for token in range(100, 104):  # decode to 13 tokens: each step writes its input token's KV
        req.output.append(token)
        blocks.grow(req)
        blocks.cache_blocks(req, req.num_tokens - 1)
    assert req.num_tokens == 13 and len(req.block_hashes) == 3
    table = list(req.block_table)
    blocks.release(req)  # preempted
    assert req.block_table == [] and blocks.check().num_evictable == 3

    calls = []
    monkeypatch.setattr(block_hash, "hash_block", lambda *args: calls.append(args))
    assert blocks.can_admit(req) and blocks.allocate_prefix(req) == 12 and calls == []
    assert req.block_table == table[:3]


def test_a_pending_slot_is_never_hashed():
    blocks = BlockManager(8, BS, prefix_caching=True)
    req = _prompt(0, [1, 2, 3])
    _prefill(blocks, req)
    req.reserve_output_slot()  # the first block is full, its last slot not read yet
    blocks.grow(req)
    blocks.cache_blocks(req, 4)  # the next step wrote its KV, whose value the host does not know yet
    assert req.block_hashes == [] and blocks.check().num_cached == 0
    waiting = _prompt(1, [1, 2, 3, 4, 5])
    assert blocks.cached_prefix(waiting) == []
    req.output[0] = 4
    blocks.cache_blocks(req, 4)
    assert len(req.block_hashes) == 1 and blocks.block_hash(req.block_table[0]) == req.block_hashes[0]
    assert blocks.cached_prefix(waiting) == req.block_table[:1]


def test_equal_prompts_computed_together_register_one_block_per_hash():
    blocks = BlockManager(8, BS, prefix_caching=True)
    a, b = _prompt(0, range(9)), _prompt(1, range(9))
    for req in (a, b):  # both admitted before either is computed: no hit
        assert blocks.allocate_prefix(req) == 0
        blocks.grow(req)
    for req in (a, b):
        blocks.cache_blocks(req, req.num_tokens)
    assert [blocks.block_hash(block) for block in a.block_table[:2]] == a.block_hashes == b.block_hashes
    assert [blocks.block_hash(block) for block in b.block_table] == [None] * 3
    blocks.release(b)
    assert sorted(blocks.free) == sorted(set(range(8)) - set(a.block_table)) and not blocks.evictable
    table = a.block_table
    blocks.release(a)
    assert list(blocks.evictable) == table[1::-1]  # released tail first
    blocks.check()


def test_evictable_hit_blocks_are_not_counted_twice():
    blocks = BlockManager(3, BS, prefix_caching=True)
    a = _prompt(0, range(8))
    _prefill(blocks, a)
    blocks.release(a)  # two evictable blocks and one free
    fits, too_long = _prompt(1, list(range(8)) + [1, 2, 3, 4]), _prompt(2, list(range(8)) + [1] * 8)
    assert blocks.can_admit(fits)  # a hit of two, one new block of the three free
    assert not blocks.can_admit(too_long)  # a hit of two, two new blocks of the one left besides the hit
    assert blocks.allocate_prefix(fits) == 8 and blocks.num_free_blocks == 1 and blocks.can_grow(fits)


def test_without_prefix_caching_nothing_is_hashed_or_shared():
    blocks = BlockManager(8, BS)
    for i in range(2):
        req = _prompt(i, range(9))
        assert blocks.can_admit(req) == blocks.can_grow(req) and blocks.allocate_prefix(req) == 0
        blocks.grow(req)
        blocks.cache_blocks(req, req.num_tokens)
        assert req.block_hashes == [] and blocks.cached_prefix(req) == []
    stats = blocks.check()
    assert (stats.num_used, stats.num_cached, stats.query_tokens) == (6, 0, 0)


@dataclass
class _Seq:
    """A request as the test drives it: `truth` holds every token's value, PENDING slots included."""

    req: Request
    truth: list[int]
    computed: int = 0  # tokens whose KV is written
    running: bool = False
    done: bool = False


MAX_TOKENS = 20
# Each op: (kind, which sequence or prompt, a size or token, a flag).
PREFIX_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "admit", "admit", "step", "step", "step", "step", "fill", "preempt", "finish"]),
        st.integers(0, 99),
        st.integers(1, 9),
        st.booleans(),
    ),
    min_size=20,
    max_size=80,
)
# Prompts sharing prefixes of one base, over few token values: equal blocks after different prefixes abound.
TOKENS = st.lists(st.integers(1, 3), max_size=12)
PROMPTS = st.lists(st.tuples(st.integers(0, 12), TOKENS), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None, database=None)
@given(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4), base=TOKENS, prompts=PROMPTS, ops=PREFIX_OPS)
def test_prefix_caching_keeps_blocks_accounted_and_hits_exact(num_blocks, block_size, base, prompts, ops):
    """Random adds, admissions (with the hit, or declining it), chunked prefill and decode steps (a sampled
    token left PENDING or known at once), fills of PENDING slots, preemptions and finishes. The fake cache
    holds, per slot, the token prefix its KV was computed from: a hit must read its own prefix's KV."""
    blocks = BlockManager(num_blocks, block_size, prefix_caching=True)
    kv: dict[int, list[tuple[int, ...] | None]] = {block: [None] * block_size for block in range(num_blocks)}
    seqs: list[_Seq] = []

    def add(index: int) -> None:
        cut, suffix = prompts[index % len(prompts)]
        prompt = (base[:cut] + suffix) or [1]
        seqs.append(_Seq(_prompt(len(seqs), prompt), list(prompt)))

    for index in range(len(prompts)):  # each prompt once to start with
        add(index)

    def forward(seq: _Seq, target: int) -> None:
        for pos in range(seq.computed, target):
            block = seq.req.block_table[pos // block_size]
            assert blocks.refcount(block) == 1 and blocks.block_hash(block) is None  # nobody else reads it
            kv[block][pos % block_size] = tuple(seq.truth[: pos + 1])
        seq.computed = target
        blocks.cache_blocks(seq.req, seq.computed)  # may count a PENDING slot: its KV is written

    def stop(seq: _Seq, done: bool) -> None:
        blocks.release(seq.req)
        seq.computed, seq.running, seq.done = 0, False, done

    for kind, index, size, flag in ops:
        waiting = [seq for seq in seqs if not seq.running and not seq.done]
        running = [seq for seq in seqs if seq.running]
        if kind == "add":
            add(index)
        elif kind == "admit" and waiting:
            seq = waiting[index % len(waiting)]
            req, decline = seq.req, flag and index % 3 == 0
            hit = 0 if decline else len(blocks.cached_prefix(req)) * block_size
            target = min(req.num_tokens, hit + size)
            fits = blocks.can_grow(req, target) if decline else blocks.can_admit(req, target)
            if not decline:  # exact: the hit's own evictable blocks are not counted as free as well
                shadow_blocks, shadow_req = copy.deepcopy((blocks, req))
                shadow_blocks.allocate_prefix(shadow_req)
                assert fits == shadow_blocks.can_grow(shadow_req, target)
            if fits:
                assert (0 if decline else blocks.allocate_prefix(req)) == hit <= req.num_tokens - 1
                blocks.grow(req, target)
                seq.computed, seq.running = hit, True
                forward(seq, target)
        elif kind == "step" and running:
            seq = running[index % len(running)]
            req = seq.req
            target = min(req.num_tokens, seq.computed + size)
            if not blocks.can_grow(req, target):
                stop(seq, done=False)  # preempted, as the scheduler does when blocks run out
                continue
            blocks.grow(req, target)
            forward(seq, target)
            if seq.computed == req.num_tokens:  # sampled a token
                seq.truth.append(1 + size % 3)
                req.output.append(PENDING if flag else seq.truth[-1])
                if req.num_tokens >= MAX_TOKENS:
                    stop(seq, done=True)
        elif kind == "fill":
            for seq in seqs:
                seq.req.output = seq.truth[len(seq.req.prompt) :]
        elif kind == "preempt" and running:
            stop(running[index % len(running)], done=False)
        elif kind == "finish" and (waiting or running):
            stop((waiting + running)[index % len(waiting + running)], done=True)
        _check_prefix_state(blocks, seqs, kv)


def _check_prefix_state(blocks: BlockManager, seqs: list[_Seq], kv: dict) -> None:
    stats = blocks.check()
    assert stats.num_free + stats.num_used + stats.num_evictable == blocks.num_blocks
    owners = Counter(block for seq in seqs for block in seq.req.block_table)
    for block in range(blocks.num_blocks):
        assert blocks.refcount(block) == owners[block]
        assert owners[block] <= 1 or blocks.block_hash(block) is not None  # shared only when cached
    size = blocks.block_size
    prefixes = {}  # each sequence's chained hashes, from scratch, and the token prefix each stands for
    for seq in seqs:
        parent = ROOT
        for end in range(size, len(seq.truth) + 1, size):
            parent = hash_block(parent, seq.truth[end - size : end])
            prefixes[parent] = tuple(seq.truth[:end])
    for block in range(blocks.num_blocks):  # a cached block, used or not, holds the KV its hash stands for
        key = blocks.block_hash(block)
        if key is not None:
            tokens = prefixes[key]
            assert kv[block] == [tokens[: len(tokens) - size + 1 + slot] for slot in range(size)]
    for seq in seqs:
        table = seq.req.block_table
        assert len(set(table)) == len(table) and (seq.running or not table)
        assert len(table) >= cdiv(seq.computed, size)
        for pos in range(seq.computed):  # what the next forward reads: its own prefix's KV
            assert kv[table[pos // size]][pos % size] == tuple(seq.truth[: pos + 1])
        for i, block in enumerate(table):
            key = blocks.block_hash(block)
            assert key is None or (key == seq.req.block_hashes[i] and PENDING not in seq.req.tokens[: (i + 1) * size])
