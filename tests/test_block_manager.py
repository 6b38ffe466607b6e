from hypothesis import given, settings
from hypothesis import strategies as st

from qwen3_runtime import SamplingParams
from qwen3_runtime.block_manager import BlockManager
from qwen3_runtime.ops import cdiv
from qwen3_runtime.request import Request


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
