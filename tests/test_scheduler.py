from hypothesis import given, settings
from hypothesis import strategies as st

from qwen3_runtime import SamplingParams
from qwen3_runtime.block_manager import BlockManager
from qwen3_runtime.config import EngineConfig
from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import Request, Status
from qwen3_runtime.scheduler import Scheduler

MAX_MODEL_LEN = 32


def _scheduler(num_blocks: int, block_size: int = 4, max_num_seqs: int = 8, max_num_batched_tokens: int = 64):
    engine = EngineConfig(
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
    )
    return Scheduler(engine, BlockManager(num_blocks, block_size))


def _request(request_id: int, prompt_len: int) -> Request:
    return Request(request_id, [1] * prompt_len, SamplingParams(), seed=0)


def _step(batch: list[Request]) -> None:
    """What a step does to the scheduled requests: one new token each."""
    for req in batch:
        req.output.append(0)


def _ids(reqs) -> list[int]:
    return [req.request_id for req in reqs]


def _add(sched: Scheduler, *prompt_lens: int) -> list[Request]:
    reqs = [_request(len(sched.waiting) + len(sched.running) + i, n) for i, n in enumerate(prompt_lens)]
    for req in reqs:
        sched.add(req)
    return reqs


def _schedule(sched: Scheduler) -> tuple[list[int], bool]:
    batch, is_prefill = sched.schedule()
    return _ids(batch), is_prefill


def test_admission_stops_at_max_num_seqs():
    sched = _scheduler(num_blocks=100, max_num_seqs=2)
    reqs = _add(sched, 3, 3, 3)
    assert _schedule(sched) == ([0, 1], True)
    assert not sched.can_admit() and _ids(sched.waiting) == [2]
    assert _schedule(sched) == ([0, 1], False)  # the running ones decode; the third waits
    sched.finish(reqs[0])
    assert sched.can_admit() and _schedule(sched) == ([2], True)


def test_admission_stops_at_max_num_batched_tokens_in_arrival_order():
    sched = _scheduler(num_blocks=100, max_num_batched_tokens=40)
    _add(sched, 30, 20, 5)
    assert _schedule(sched) == ([0], True)  # 30 + 20 > 40: the second waits, and the third behind it
    assert _schedule(sched) == ([1, 2], True)  # 25 tokens in one prefill


def test_admission_stops_when_blocks_run_out():
    sched = _scheduler(num_blocks=5, block_size=4)
    reqs = _add(sched, 9, 9, 1)  # 3 + 3 blocks: the second does not fit, and the third waits behind it
    assert _schedule(sched) == ([0], True) and reqs[0].block_table == [0, 1, 2]
    assert not sched.can_admit() and len(sched.blocks.free) == 2
    assert _schedule(sched) == ([0], False)  # decode: its 3 blocks hold token 10
    sched.finish(reqs[0])
    assert _schedule(sched) == ([1, 2], True)


def test_the_newest_running_request_is_preempted_and_queued_first():
    sched = _scheduler(num_blocks=3, block_size=4)
    a, b, c = _add(sched, 4, 2, 2)  # a block each: none free
    assert _schedule(sched) == ([0, 1, 2], True)
    (d,) = _add(sched, 1)  # cannot be admitted: no block free
    _step([a, b, c])  # a's 5th token needs a second block
    assert _schedule(sched) == ([0, 1], False)
    assert sched.num_preemptions == 1 and _ids(sched.running) == [0, 1] and _ids(sched.waiting) == [2, 3]
    assert c.status is Status.WAITING and c.block_table == [] and len(a.block_table) == 2


def test_preempted_requests_are_requeued_ahead_of_new_ones_in_arrival_order():
    sched = _scheduler(num_blocks=3, block_size=4)
    a, b, c = _add(sched, 4, 4, 4)
    assert _schedule(sched) == ([0, 1, 2], True)
    _add(sched, 1)
    _step([a, b, c])  # every one needs a second block: c goes for a, then b for itself
    assert _schedule(sched) == ([0], False) and sched.num_preemptions == 2
    assert _ids(sched.waiting) == [1, 2, 3] and _ids(sched.running) == [0]
    _step([a])
    sched.finish(a)
    # Recomputed from prompt and output: b's 5 tokens take 2 blocks, c's would take 2 more of the 1 left.
    assert _schedule(sched) == ([1], True) and _ids(sched.waiting) == [2, 3]


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
    max_num_batched_tokens=st.integers(MAX_MODEL_LEN, 2 * MAX_MODEL_LEN),
    ops=OPS,
)
def test_any_sequence_of_steps_keeps_blocks_and_queues_consistent(
    block_size, extra_blocks, max_num_seqs, max_num_batched_tokens, ops
):
    """Random adds, steps (prefill or decode, each scheduled request gaining a token; those at max_model_len
    end, as the runtime ends them) and finishes (running or waiting, as an error or a stop does)."""
    num_blocks = cdiv(MAX_MODEL_LEN, block_size) + extra_blocks  # any one request fits alone
    sched = _scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
    reqs: list[Request] = []
    for op, arg in ops:
        if op == "add":
            reqs.append(_request(len(reqs), 1 + arg % (12 if arg < 80 else MAX_MODEL_LEN)))  # mostly short: many grow
            sched.add(reqs[-1])
        elif op == "finish" and sched.has_work():
            live = list(sched.waiting) + sched.running
            sched.finish(live[arg % len(live)])
        elif op == "step":
            _check_step(sched)
        _check_state(sched, reqs, num_blocks)


def _check_step(sched: Scheduler) -> None:
    running, waiting = _ids(sched.running), _ids(sched.waiting)
    batch, is_prefill = sched.schedule()
    assert bool(batch) == bool(running or waiting)  # something always runs: any one request fits
    if is_prefill:  # admitted from the head of the queue, within the limits
        assert _ids(batch) == waiting[: len(batch)] and _ids(sched.running) == running + _ids(batch)
        assert sum(req.num_tokens for req in batch) <= sched.cfg.max_num_batched_tokens
    else:  # every running request, but the newest ones preempted: queued first, in their order
        kept = len(sched.running)
        assert _ids(batch) == running[:kept] == _ids(sched.running)
        assert _ids(sched.waiting) == running[kept:] + waiting
        assert sched.num_preemptions >= len(running) - kept
    assert len(sched.running) <= sched.cfg.max_num_seqs
    for req in batch:  # blocks for every token the step writes, no more
        assert len(req.block_table) == cdiv(req.num_tokens, sched.blocks.block_size)
    _step(batch)
    for req in batch:
        if req.num_tokens >= sched.cfg.max_model_len:
            sched.finish(req)


def _check_state(sched: Scheduler, reqs: list[Request], num_blocks: int) -> None:
    owned = [block for req in reqs for block in req.block_table]
    assert sorted(owned + list(sched.blocks.free)) == list(range(num_blocks))  # free + used = total, none twice
    assert all(req.status is Status.WAITING and not req.block_table for req in sched.waiting)
    assert all(req.status is Status.RUNNING for req in sched.running)
    live = _ids(sched.waiting) + _ids(sched.running)
    assert sorted(live) == [req.request_id for req in reqs if req.status is not Status.FINISHED]
    assert all(not req.block_table for req in reqs if req.status is Status.FINISHED)
