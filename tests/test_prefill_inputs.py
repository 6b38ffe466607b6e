from types import SimpleNamespace

import numpy as np
import pytest
import torch

from qwen3_runtime.ops.prefill_attention import max_tiles, tile_table
from qwen3_runtime.prefill_inputs import PrefillStager
from qwen3_runtime.scheduler import PrefillChunk

BLOCK_SIZE, MAX_SEQS, MAX_BLOCKS = 4, 3, 5


def _chunk(tokens: list[int], table: list[int], start: int, end: int) -> PrefillChunk:
    req = SimpleNamespace(tokens=tokens, block_table=table, num_tokens=len(tokens))
    return PrefillChunk(req, start, end)


@pytest.fixture
def stager() -> PrefillStager:
    return PrefillStager(32, MAX_SEQS, MAX_BLOCKS, BLOCK_SIZE, group_size=4, device=torch.device("cpu"))


def test_chunks_are_packed_and_padded_to_the_bucket(stager):
    # the second chunk of a prompt (starting mid-block) and a whole prompt
    chunks = [_chunk(list(range(100, 110)), [7, 2, 9], 6, 10), _chunk([5, 6, 7], [4], 0, 3)]

    stager.stage(chunks, padded_tokens=16)

    input_ids, positions, slots, prev_rows = stager.token_inputs(16)
    assert input_ids.tolist() == [106, 107, 108, 109, 5, 6, 7] + [0] * 9
    assert positions.tolist() == [6, 7, 8, 9, 0, 1, 2] + [0] * 9
    assert slots.tolist() == [2 * 4 + 2, 2 * 4 + 3, 9 * 4, 9 * 4 + 1, 16, 17, 18] + [-1] * 9
    assert prev_rows.tolist() == [-1] * 16  # no step in flight
    plan = stager.plan(16)
    starts, tiles = tile_table([4, 3], [10, 3], stager.block_q)
    assert plan.query_start_loc[:3].tolist() == starts.tolist() and plan.seq_lens[:2].tolist() == [10, 3]
    assert plan.tiles.shape[0] == max_tiles(16, MAX_SEQS, stager.block_q)
    assert plan.tiles[: len(tiles)].tolist() == tiles.tolist()
    assert (plan.tiles[len(tiles) :, 0] == -1).all()
    assert plan.block_tables[0, :3].tolist() == [7, 2, 9] and plan.block_tables[1, :1].tolist() == [4]
    assert (plan.host_query_lens, plan.host_seq_lens) == ([4, 3], [10, 3])


def test_a_decoding_row_fed_by_the_step_in_flight_takes_its_row_there(stager):
    """A riding row whose token the step in flight samples: its last (only) token row carries that step's row,
    every other row -1, also after a staging that set some."""
    chunks = [_chunk([5, 6, 7, -1], [4], 3, 4), _chunk(list(range(10)), [1, 2, 3], 4, 10), _chunk([8, 9], [5], 1, 2)]
    stager.stage(chunks, padded_tokens=16, prev_rows=[2, -1, 0])
    assert stager.token_inputs(16)[3].tolist() == [2] + [-1] * 6 + [0] + [-1] * 8
    stager.stage(chunks[1:], padded_tokens=16)
    assert stager.token_inputs(16)[3].tolist() == [-1] * 16


def test_a_smaller_prefill_pads_over_the_stale_rows(stager):
    stager.stage([_chunk(list(range(20)), [0, 1, 2, 3, 4], 0, 20)], padded_tokens=32)
    stager.stage([_chunk([3, 4], [6], 0, 2)], padded_tokens=16)

    input_ids, _, slots, _ = stager.token_inputs(16)
    assert input_ids.tolist() == [3, 4] + [0] * 14 and slots.tolist() == [24, 25] + [-1] * 14
    tiles = stager.plan(16).tiles.tolist()
    assert tiles[0] == [0, 0] and all(seq == -1 for seq, _ in tiles[1:])


def test_the_copy_stops_after_the_chunks_block_tables(stager):
    stager.inputs.block_tables.fill_(-9)  # poison: tables past the staged rows must keep it
    stager.stage([_chunk([1, 2, 3], [8], 0, 3)], padded_tokens=16)

    assert stager.inputs.block_tables[0, 0].item() == 8
    assert (stager.inputs.block_tables[1:] == -9).all()
    assert np.array_equal(stager.inputs.tokens.numpy()[:, :16], stager.host.tokens.numpy()[:, :16])


def test_staging_no_chunk_leaves_padding_alone(stager):
    """What a graph capture runs on after an earlier prefill (the memory profile's) staged real tiles."""
    stager.stage([_chunk(list(range(20)), [0, 1, 2, 3, 4], 0, 20)], padded_tokens=32)
    stager.stage([], padded_tokens=32)

    input_ids, positions, slots, prev_rows = stager.token_inputs(32)
    assert input_ids.tolist() == positions.tolist() == [0] * 32 and slots.tolist() == prev_rows.tolist() == [-1] * 32
    plan = stager.plan(32)
    assert (plan.tiles[:, 0] == -1).all() and plan.host_query_lens == plan.host_seq_lens == []
