"""The prefill forward's inputs in static buffers: packed tokens and the attention plan, so one CUDA graph per
token bucket replays any prefill of up to that many tokens (and at most max_seqs chunks).

A decoding row riding in the step while the step before is in flight (async scheduling) has its input token
read on the device from that step's results (prev_row >= 0, as in decode). Token rows past the real ones are
padding (token 0 at position 0, cache slot -1: not stored, and attended by no tile); the tile table is padded
with tiles of sequence -1 up to the bucket's fixed grid. Everything goes to the device in one copy from a
pinned host mirror."""

from __future__ import annotations

import numpy as np
import torch

from qwen3_runtime.kv_cache import cache_slot
from qwen3_runtime.ops.prefill_attention import PrefillPlan, max_tiles, tile_table, tile_tokens
from qwen3_runtime.scheduler import PrefillChunk
from qwen3_runtime.step_inputs import copy_through_tables, packed_views, wait_for_host_copy

TOKEN_PADDING = np.array([0, 0, -1, -1], dtype=np.int64)[:, None]  # input id, position, cache slot, prev_row
PADDING_TILE = np.array([-1, 0], dtype=np.int32)


class PrefillBuffers:
    """One byte buffer: int64 tokens [4, max_tokens] (input ids, positions, cache slots, rows of the step in
    flight whose sampled token is the input: -1 for none), then int32 query start locations [max_seqs + 1],
    sequence lengths [max_seqs], tiles [max_tiles, 2] and block tables [max_seqs, max_blocks], the tables last
    so a copy can stop after the rows in use."""

    def __init__(
        self, max_tokens: int, max_seqs: int, max_blocks: int, block_q: int, device: torch.device, pin: bool = False
    ) -> None:
        shapes = (
            ((4, max_tokens), torch.int64),
            ((max_seqs + 1,), torch.int32),
            ((max_seqs,), torch.int32),
            ((max_tiles(max_tokens, max_seqs, block_q), 2), torch.int32),
            ((max_seqs, max_blocks), torch.int32),
        )
        self.buffer, views = packed_views(shapes, device, pin)
        self.tokens, self.query_start_loc, self.seq_lens, self.tiles, self.block_tables = views


class PrefillStager:
    """Fills the device buffers the prefill forward (captured or not) reads, and gives its plan."""

    def __init__(
        self, max_tokens: int, max_seqs: int, max_blocks: int, block_size: int, group_size: int, device: torch.device
    ) -> None:
        self.block_size, self.group_size, self.max_seqs = block_size, group_size, max_seqs
        self.block_q = tile_tokens(group_size)
        pinned = device.type == "cuda"
        self.inputs = PrefillBuffers(max_tokens, max_seqs, max_blocks, self.block_q, device)
        self.host = PrefillBuffers(max_tokens, max_seqs, max_blocks, self.block_q, torch.device("cpu"), pinned)
        self._host_copied = torch.cuda.Event() if pinned else None
        self._query_lens: list[int] = []
        self._seq_lens: list[int] = []

    def stage(self, chunks: list[PrefillChunk], padded_tokens: int, prev_rows: list[int] | None = None) -> None:
        """The chunks' tokens back to back, padded to `padded_tokens` rows, and their plan. prev_rows[i] >= 0:
        chunk i is a decoding row whose input is the token the step in flight samples in that row."""
        wait_for_host_copy(self._host_copied)
        assert len(chunks) <= self.max_seqs
        host = self.host
        self._query_lens = [c.num_tokens for c in chunks]
        self._seq_lens = [c.end for c in chunks]
        num_tokens = sum(self._query_lens)
        tokens = host.tokens.numpy()
        if chunks:  # none: padding alone, what a graph capture runs on
            tokens[0, :num_tokens] = np.concatenate([c.req.tokens[c.start : c.end] for c in chunks])
            tokens[1, :num_tokens] = np.concatenate([np.arange(c.start, c.end) for c in chunks])
            tokens[2, :num_tokens] = np.concatenate(
                [cache_slot(np.asarray(c.req.block_table), np.arange(c.start, c.end), self.block_size) for c in chunks]
            )
            tokens[3, :num_tokens] = -1
            if prev_rows:
                ends = np.cumsum(self._query_lens)
                tokens[3, ends - 1] = prev_rows  # -1 where the input is known
        tokens[:, num_tokens:padded_tokens] = TOKEN_PADDING
        starts, tiles = tile_table(self._query_lens, self._seq_lens, self.block_q)
        host.query_start_loc.numpy()[: len(starts)] = starts
        host.seq_lens.numpy()[: len(chunks)] = self._seq_lens
        host_tiles = host.tiles.numpy()
        host_tiles[: len(tiles)] = tiles
        host_tiles[len(tiles) : self._num_tiles(padded_tokens)] = PADDING_TILE
        tables = host.block_tables.numpy()
        for row, chunk in enumerate(chunks):
            table = chunk.req.block_table
            tables[row, : len(table)] = table
        copy_through_tables(self.inputs.buffer, host.buffer, host.block_tables, len(chunks))
        if self._host_copied is not None:
            self._host_copied.record()

    def token_inputs(self, padded_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input ids, positions, cache slots and prev_rows of the first `padded_tokens` rows."""
        input_ids, positions, slots, prev_rows = self.inputs.tokens[:, :padded_tokens]
        return input_ids, positions, slots, prev_rows

    def plan(self, padded_tokens: int) -> PrefillPlan:
        """The attention plan over static buffers, its tile grid fixed by the token count."""
        inp = self.inputs
        return PrefillPlan(
            inp.query_start_loc, inp.seq_lens, inp.block_tables, inp.tiles[: self._num_tiles(padded_tokens)],
            self.block_q, self.group_size, self._query_lens, self._seq_lens,
        )  # fmt: skip

    def _num_tiles(self, padded_tokens: int) -> int:
        return max_tiles(padded_tokens, self.max_seqs, self.block_q)
