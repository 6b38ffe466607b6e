from hypothesis import given, settings
from hypothesis import strategies as st

from qwen3_runtime import SamplingParams
from qwen3_runtime.block_manager import BlockManager
from qwen3_runtime.config import EngineConfig
from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import PENDING, Request, Status
from qwen3_runtime.scheduler import PrefillChunk, Scheduler

MAX_MODEL_LEN = 32


def _scheduler(
    num_blocks: int,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    prefix_caching: bool = False,
    batch_invariant: bool = False,
):
    engine = EngineConfig(
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        batch_invariant=batch_invariant,
    )
    return Scheduler(engine, BlockManager(num_blocks, block_size, prefix_caching))


def _request(request_id: int, prompt_len: int, prompt_logprobs: int | None = None, token: int = 1) -> Request:
    return Request(request_id, [token] * prompt_len, SamplingParams(prompt_logprobs=prompt_logprobs), seed=0)


def _step(batch: list, is_prefill: bool) -> None:
    """What a step does: a token for each decoded request and each request whose last chunk ran."""
    for item in batch:
        if not is_prefill or item.is_last:
            (item.req if is_prefill else item).output.append(0)


def _ids(reqs) -> list[int]:
    return [req.request_id for req in reqs]


def _add(sched: Scheduler, *prompt_lens: int) -> list[Request]:
    start = len(sched.waiting) + len(sched.prefilling) + len(sched.running)
    reqs = [_request(start + i, n) for i, n in enumerate(prompt_lens)]
    for req in reqs:
        sched.add(req)
    return reqs


def _schedule(sched: Scheduler) -> tuple[list, bool]:
    """(request id, start, end) per prefill chunk, or the decoded ids; and whether it is a prefill. Runs it."""
    batch, is_prefill = sched.schedule()
    _step(batch, is_prefill)
    if is_prefill:
        return [(c.req.request_id, c.start, c.end) for c in batch], True
    return _ids(batch), False


def test_admission_stops_at_max_num_seqs():
    sched = _scheduler(num_blocks=100, max_num_seqs=2)
    reqs = _add(sched, 3, 3, 3)
    assert _schedule(sched) == ([(0, 0, 3), (1, 0, 3)], True)
    assert not sched.prefill_due() and _ids(sched.waiting) == [2]
    assert _schedule(sched) == ([0, 1], False)  # the running ones decode; the third waits
    sched.finish(reqs[0])
    assert sched.prefill_due() and _schedule(sched) == ([(1, 4, 5), (2, 0, 3)], True)  # 1 decodes in it


def test_prompts_are_chunked_within_the_token_budget_and_decoding_rides_along():
    sched = _scheduler(num_blocks=100, max_num_batched_tokens=16)
    _add(sched, 10, 20, 5)
    assert _schedule(sched) == ([(0, 0, 10), (1, 0, 6)], True)  # the second prompt's first chunk fills the step
    assert _ids(sched.prefilling) == [1] and _ids(sched.running) == [0]
    # The decoding request's last token leads the step, within the budget; the chunked prompt, then the queue.
    assert _schedule(sched) == ([(0, 10, 11), (1, 6, 20), (2, 0, 1)], True)
    assert _schedule(sched) == ([(0, 11, 12), (1, 20, 21), (2, 1, 5)], True)
    assert _schedule(sched) == ([0, 1, 2], False) and _schedule(sched) == ([0, 1, 2], False)  # nothing to prefill


def test_the_decoding_rows_leave_the_prompts_a_token_at_least():
    """The budget is at least max_num_seqs, so while prompts are pending they get what the rows leave."""
    sched = _scheduler(num_blocks=100, max_num_seqs=3, max_num_batched_tokens=3)
    _add(sched, 1, 1, 5)
    assert _schedule(sched) == ([(0, 0, 1), (1, 0, 1), (2, 0, 1)], True)
    assert _schedule(sched) == ([(0, 1, 2), (1, 1, 2), (2, 1, 2)], True)  # two rows ride, one prompt token
    assert _schedule(sched) == ([(0, 2, 3), (1, 2, 3), (2, 2, 3)], True)


def test_a_request_preempted_with_a_row_in_flight_waits_for_its_token():
    """Its recomputation needs every token: until the step in flight is read, the queue behind it waits too."""
    sched = _scheduler(num_blocks=100)
    preempted, behind = _add(sched, 3, 3)
    preempted.output = [5, PENDING]  # what a preemption leaves while its row of the step in flight is unread
    assert not sched.prefill_due() and sched.schedule() == ([], False)
    preempted.output[-1] = 7  # the step in flight is read
    assert _schedule(sched) == ([(0, 0, 5), (1, 0, 3)], True)
    assert behind.status is Status.RUNNING


def test_a_chunked_prompt_holds_blocks_for_all_its_tokens_from_admission():
    sched = _scheduler(num_blocks=6, block_size=4, max_num_seqs=4, max_num_batched_tokens=4)
    a, b = _add(sched, 16, 9)  # a takes 4 blocks; b needs 3 of the 2 left
    assert _schedule(sched) == ([(0, 0, 4)], True) and len(a.block_table) == 4
    assert not sched.waiting[0].block_table and sched.blocks.num_free_blocks == 2
    for start in (4, 8, 12):  # nothing decodes yet, so chunks follow each other
        assert _schedule(sched) == ([(0, start, start + 4)], True)
    assert _schedule(sched) == ([0], False) and _ids(sched.waiting) == [1]


def test_admission_stops_when_blocks_run_out():
    sched = _scheduler(num_blocks=5, block_size=4)
    reqs = _add(sched, 9, 9, 1)  # 3 + 3 blocks: the second does not fit, and the third waits behind it
    assert _schedule(sched) == ([(0, 0, 9)], True) and reqs[0].block_table == [0, 1, 2]
    assert not sched.prefill_due() and sched.blocks.num_free_blocks == 2
    assert _schedule(sched) == ([0], False)  # decode: its 3 blocks hold token 10
    sched.finish(reqs[0])
    assert _schedule(sched) == ([(1, 0, 9), (2, 0, 1)], True)


def test_the_newest_running_request_is_preempted_and_queued_first():
    sched = _scheduler(num_blocks=3, block_size=4)
    a, b, c = _add(sched, 3, 2, 2)  # a block each: none free
    assert _schedule(sched) == ([(0, 0, 3), (1, 0, 2), (2, 0, 2)], True)
    _add(sched, 1)  # cannot be admitted: no block free
    a.output.append(0)  # a's 5th token needs a second block
    assert _schedule(sched) == ([0, 1], False)
    assert sched.num_preemptions == 1 and _ids(sched.running) == [0, 1] and _ids(sched.waiting) == [2, 3]
    assert c.status is Status.WAITING and c.block_table == [] and len(a.block_table) == 2


def test_a_newer_request_still_prefilling_is_preempted_before_an_older_decoding_one():
    """As in vLLM: the newest admitted request goes first, even mid-prompt; it restarts from its cached blocks."""
    sched = _scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=8, prefix_caching=True)
    a, b = _request(0, 4), _request(1, 12, token=2)  # a: one block, then decoding; b: three, a chunk a step
    sched.add(a), sched.add(b)
    assert _schedule(sched) == ([(0, 0, 4), (1, 0, 4)], True) and sched.blocks.num_free_blocks == 0
    # a's 5th token needs a second block: b, newer and mid-prompt, gives its back (and cannot come back yet)
    assert sched.schedule() == ([a], False) and len(a.block_table) == 2
    assert sched.num_preemptions == 1 and b.preempted and b not in sched.prefilling
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and not b.block_table  # 2 blocks free of 3
    assert sched.blocks.cached_prefix(b) != []  # its first block stays cached for its readmission


def test_a_request_short_of_blocks_waits_for_those_a_finishing_request_frees():
    """Async scheduling: blocks of a request ending with the step in flight come free once it is read; a request
    that needs them skips a step rather than preempting itself (and recomputing everything)."""
    sched = _scheduler(num_blocks=2, block_size=4)
    a, b = _add(sched, 3, 4)  # a block each; b's next token needs a second
    assert _schedule(sched) == ([(0, 0, 3), (1, 0, 4)], True)
    assert sched.decode_batch(finishing=frozenset({0})) == [] and sched.num_preemptions == 0  # b waits
    sched.finish(a)
    assert sched.decode_batch() == [b] and len(b.block_table) == 2


def test_a_preempted_request_is_recomputed_from_its_prompt_and_output():
    sched = _scheduler(num_blocks=3, block_size=4)
    a, b, c = _add(sched, 4, 4, 4)
    assert _schedule(sched) == ([(0, 0, 4), (1, 0, 4), (2, 0, 4)], True)
    _add(sched, 1)
    assert _schedule(sched) == ([0], False) and sched.num_preemptions == 2  # each wants a second block
    assert _ids(sched.waiting) == [1, 2, 3] and _ids(sched.running) == [0]
    sched.finish(a)
    # b's prompt and its one output: 5 tokens, two blocks; c's would take two more of the one left.
    assert _schedule(sched) == ([(1, 0, 5)], True) and _ids(sched.waiting) == [2, 3]


def test_a_cached_prefix_is_reused_but_not_by_requests_asking_for_prompt_logprobs():
    sched = _scheduler(num_blocks=20, block_size=4, prefix_caching=True)
    first = _request(0, 10)
    sched.add(first)
    assert _schedule(sched) == ([(0, 0, 10)], True)  # two full blocks registered
    hit, logprobs, whole = _request(1, 12), _request(2, 12, prompt_logprobs=1), _request(3, 8)
    for req in (hit, logprobs, whole):
        sched.add(req)
    # The hit starts after the 8 cached tokens; a fully cached prompt still computes its last block.
    assert _schedule(sched) == ([(0, 10, 11), (1, 8, 12), (2, 0, 12), (3, 4, 8)], True)
    assert hit.block_table[:2] == first.block_table[:2] == whole.block_table[:1] + [first.block_table[1]]
    assert logprobs.block_table[0] not in first.block_table
    assert sched.blocks.stats().hit_tokens == 8 + 4


def test_a_finished_request_leaves_its_full_blocks_cached_up_to_its_last_computed_token():
    sched = _scheduler(num_blocks=20, block_size=4, prefix_caching=True)
    (a,) = _add(sched, 6)
    _schedule(sched)  # prefill: 6 tokens, one full block; a's first output comes with it
    for _ in range(3):
        _schedule(sched)  # three decode steps: outputs 2..4, 10 tokens known, KV written for 9
    sched.finish(a)
    stats = sched.blocks.check()
    assert stats.num_cached == 2 and stats.num_evictable == 2 and stats.num_used == 0
    again = Request(1, a.prompt + a.output[:3], SamplingParams(), seed=0)  # 9 tokens: 8 reusable
    sched.add(again)
    assert _schedule(sched) == ([(1, 8, 9)], True)


# Mostly steps, so requests grow until blocks run out and the scheduler preempts.
OPS = st.lists(
    st.tuples(st.sampled_from(["add", "add", "step", "step", "step", "step", "finish"]), st.integers(0, 99)),
    min_size=10,
    max_size=80,
)


@settings(max_examples=150, deadline=None, database=None)
@given(
    block_size=st.integers(1, 8),
    extra_blocks=st.integers(0, 6),
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(1, 2 * MAX_MODEL_LEN),
    prefix_caching=st.booleans(),
    ops=OPS,
)
def test_any_sequence_of_steps_keeps_blocks_and_queues_consistent(
    block_size, extra_blocks, max_num_seqs, max_num_batched_tokens, prefix_caching, ops
):
    """Random adds (prompts sharing prefixes), steps (chunks computed, requests gaining tokens; those at
    max_model_len end, as the runtime ends them) and finishes (prefilling, running or waiting, as an error,
    a stop or an abort does)."""
    num_blocks = cdiv(MAX_MODEL_LEN, block_size) + extra_blocks  # any one request fits alone
    max_num_seqs = min(max_num_seqs, max_num_batched_tokens)  # the config's rule
    sched = _scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens, prefix_caching)
    reqs: list[Request] = []
    for op, arg in ops:
        if op == "add":
            length = 1 + arg % (12 if arg < 80 else MAX_MODEL_LEN)  # mostly short: many grow
            reqs.append(Request(len(reqs), [1 + arg % 3] * length, SamplingParams(), seed=0))
            sched.add(reqs[-1])
        elif op == "finish" and sched.has_work():
            live = list(sched.waiting) + sched.prefilling + sched.running
            sched.finish(live[arg % len(live)])
        elif op == "step":
            _check_step(sched)
        _check_state(sched, reqs)


def _check_step(sched: Scheduler) -> None:
    prefilling, running, waiting = _ids(sched.prefilling), _ids(sched.running), _ids(sched.waiting)
    computed = {req.request_id: req.num_computed_tokens for req in sched.prefilling}
    victims = _record_preemptions(sched)
    batch, is_prefill = sched.schedule()
    assert bool(batch) == bool(prefilling or running or waiting)  # something always runs: any one request fits
    decoded, chunks = (batch, []) if not is_prefill else _split_mixed(batch)
    # The newest admitted requests, decoding or prefilling, are preempted (newest first: they queue first in
    # arrival order, unless readmitted); every other running request decodes.
    admitted = sorted(prefilling + running)
    assert sorted(victims) == admitted[len(admitted) - len(victims) :] and victims == sorted(victims, reverse=True)
    assert _ids(decoded) == [i for i in running if i not in victims] and all(req in sched.running for req in decoded)
    queue = victims[::-1] + waiting
    for req in decoded:  # blocks for every token the step writes, no more
        assert len(req.block_table) == cdiv(req.num_tokens, sched.blocks.block_size)
    if is_prefill:
        assert chunks and sum(c.num_tokens for c in chunks) <= sched.cfg.max_num_batched_tokens
        ids = [c.req.request_id for c in chunks]
        assert ids == ([i for i in prefilling if i not in victims] + queue)[: len(ids)]  # chunked first, then queue
        for chunk in chunks:
            assert isinstance(chunk, PrefillChunk) and 0 <= chunk.start < chunk.end <= chunk.req.num_tokens
            # Where it left off; a new or readmitted one after its cached prefix (whole blocks).
            fresh = chunk.start - chunk.start % sched.blocks.block_size
            assert chunk.start == (
                fresh if chunk.req.request_id in victims else computed.get(chunk.req.request_id, fresh)
            )
            assert (chunk.req in sched.running) == chunk.is_last
            assert len(chunk.req.block_table) == cdiv(chunk.req.num_tokens, sched.blocks.block_size)
        assert _ids(sched.waiting) == [i for i in queue if i not in ids]
    else:
        assert _ids(sched.running) == _ids(decoded) and _ids(sched.waiting) == queue
    assert len(sched.running) + len(sched.prefilling) <= sched.cfg.max_num_seqs
    _step(batch, is_prefill)
    for req in sched.running:
        if req.num_tokens >= sched.cfg.max_model_len:
            sched.finish(req)


def _record_preemptions(sched: Scheduler) -> list[int]:
    """The ids the scheduler preempts from now on, in order."""
    victims: list[int] = []
    preempt = type(sched)._preempt

    def recording(req: Request) -> None:
        victims.append(req.request_id)
        preempt(sched, req)

    sched._preempt = recording
    return victims


def _split_mixed(batch: list[PrefillChunk]) -> tuple[list[Request], list[PrefillChunk]]:
    """A prefill step's decoding requests (the leading one-token chunks of running requests) and its prompt
    chunks (each marks its tokens computed; a decoding request's mark is older than its last token)."""
    riding = [c.req.num_computed_tokens != c.end for c in batch]
    kept = riding.index(False) if False in riding else len(batch)
    assert not any(riding[kept:])
    assert all((c.start, c.end) == (c.req.num_tokens - 1, c.req.num_tokens) and c.is_last for c in batch[:kept])
    return [c.req for c in batch[:kept]], batch[kept:]


def _check_state(sched: Scheduler, reqs: list[Request]) -> None:
    stats = sched.blocks.check()
    owners: dict[int, list[Request]] = {}
    for req in reqs:
        for block in req.block_table:
            owners.setdefault(block, []).append(req)
    assert stats.num_used == len(owners)
    for block, holders in owners.items():  # shared only when cached, and then by requests with its tokens
        assert sched.blocks.refcount(block) == len(holders)
        if len(holders) > 1:
            key = sched.blocks.block_hash(block)
            assert key is not None and all(key in req.block_hashes for req in holders)
    assert all(req.status is Status.WAITING and not req.block_table for req in sched.waiting)
    assert all(req.status is Status.RUNNING for req in sched.running + sched.prefilling)
    live = _ids(sched.waiting) + _ids(sched.prefilling) + _ids(sched.running)
    assert sorted(live) == [req.request_id for req in reqs if req.status is not Status.FINISHED]
    assert all(not req.block_table for req in reqs if req.status is Status.FINISHED)


def test_batch_invariant_runs_every_step_as_a_prefill_step_the_decoding_rows_riding():
    sched = _scheduler(num_blocks=32, max_num_seqs=2, max_num_batched_tokens=6, batch_invariant=True)
    _add(sched, 5, 8)
    assert _schedule(sched) == ([(0, 0, 5), (1, 0, 1)], True)
    assert _schedule(sched) == ([(0, 5, 6), (1, 1, 6)], True)  # request 0 rides as its last token
    assert _schedule(sched) == ([(0, 6, 7), (1, 6, 8)], True)
    assert _schedule(sched) == ([(0, 7, 8), (1, 8, 9)], True)  # nothing left to prefill: still a prefill step
    sched = _scheduler(num_blocks=32)
    _add(sched, 5)
    _schedule(sched)
    assert _schedule(sched) == ([0], False)  # by default a decode step
