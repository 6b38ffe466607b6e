"""Device logprobs: logsumexp, selected-token logprob and rank, exact top-k, per row.

`reduce_logprobs` runs the Triton kernels (`ops/logprob_reduce.py`) on CUDA tensors or
under TRITON_INTERPRET=1, and `reduce_logprobs_reference` (float64 torch, O(V)
a row as the kernels are) otherwise. With a preallocated `out` the Triton path
allocates nothing and never waits for the host, so it can be captured in a
CUDA graph.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from qwen3_runtime.logprobs.reduce_reference import check_inputs, check_out, reduce_reference
from qwen3_runtime.ops import cdiv, use_triton


@dataclass(frozen=True)
class ReduceConfig:
    """Tiling of the reduction. Results are bitwise reproducible for a fixed config
    (and input alignment); a different config may change the last bits.

    chunk: vocab elements per stage-1 program; block: elements per block maximum
    (top-k candidates are whole blocks); group: block maxima per group for the
    first top-k threshold; candidates: most candidates ranked by counting in a
    top-k phase before falling back to rounds of max. All powers of two, block
    <= chunk. num_warps and finish_warps: warps of the stage-1 and stage-2
    programs. pdl: launch stage 2 with programmatic dependent launch (CUDA,
    Hopper and later); pdl_first: stage 1 too, so it starts while the kernel
    before it finishes (and waits for its results before reading anything).
    """

    chunk: int = 4096
    block: int = 128
    group: int = 32
    candidates: int = 64
    POWERS_OF_TWO: ClassVar[tuple[str, ...]] = ("chunk", "block", "group", "candidates")
    num_warps: int = 4
    finish_warps: int = 8
    pdl: bool = True
    pdl_first: bool = True

    def __post_init__(self) -> None:
        for name in self.POWERS_OF_TWO:
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name}={value} must be a power of two")
        if self.block > self.chunk:
            raise ValueError(f"block={self.block} is larger than chunk={self.chunk}")


@dataclass
class ReduceWorkspace:
    """Scratch of the Triton path, sized from (rows, vocab, k_max, config) so calls allocate nothing."""

    config: ReduceConfig
    vocab_size: int
    chunk_max: torch.Tensor  # [N, n_chunks] f32
    chunk_sumexp: torch.Tensor  # [N, n_chunks] f32, NaN where the chunk holds NaN or +inf
    chunk_ahead: torch.Tensor  # [N, n_chunks] int32
    block_max: torch.Tensor  # [N, n_blocks] f32 ([N, 0] when k_max = 0)
    scratch: torch.Tensor  # [N, 4 * config.candidates] int32: top-k compaction scratch of stage 2

    @property
    def n_chunks(self) -> int:
        return self.chunk_max.shape[1]

    @property
    def n_blocks(self) -> int:
        return self.block_max.shape[1]

    @classmethod
    def allocate(cls, n_rows: int, vocab_size: int, k_max: int, device, config: ReduceConfig) -> ReduceWorkspace:
        n_chunks = cdiv(vocab_size, config.chunk)
        n_blocks = cdiv(vocab_size, config.block) if k_max > 0 else 0

        def empty(cols: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.empty(n_rows, cols, dtype=dtype, device=device)

        return cls(
            config=config,
            vocab_size=vocab_size,
            chunk_max=empty(n_chunks, torch.float32),
            chunk_sumexp=empty(n_chunks, torch.float32),
            chunk_ahead=empty(n_chunks, torch.int32),
            block_max=empty(n_blocks, torch.float32),
            scratch=empty(4 * config.candidates if k_max > 0 else 0, torch.int32),
        )


@dataclass
class LogprobBuffers:
    """Outputs of `reduce_logprobs` for N rows (plus the scratch the kernels need).

    status: 0 ok; 1 invalid row (NaN, +inf, or every entry -inf); 2 token id
    outside [0, V). On status 1 logprob and logsumexp are NaN, rank is -1,
    top_ids -1 and top_logprobs NaN in columns < num_top. On status 2 the row
    is valid: logsumexp and the top-k are computed, logprob is NaN, rank -1.
    Columns at and past num_top (clamped to [0, min(k_max, V)]) hold -1 / -inf
    on every computed row. Fresh buffers hold NaN / -1 / -inf and status 0.
    """

    logprob: torch.Tensor  # [N] f32
    rank: torch.Tensor  # [N] int32, 1-based
    logsumexp: torch.Tensor  # [N] f32
    top_ids: torch.Tensor  # [N, k_max] int32
    top_logprobs: torch.Tensor  # [N, k_max] f32
    status: torch.Tensor  # [N] int8
    workspace: ReduceWorkspace

    @classmethod
    def allocate(
        cls, n_rows: int, k_max: int, vocab_size: int, device, config: ReduceConfig | None = None
    ) -> LogprobBuffers:
        """Buffers (and workspace) for `n_rows` rows of `vocab_size` logits and top-k up to `k_max`."""
        if n_rows < 0 or k_max < 0 or vocab_size < 1:
            raise ValueError(f"bad sizes: n_rows={n_rows}, k_max={k_max}, vocab_size={vocab_size}")
        device = torch.device(device)

        def full(shape: tuple[int, ...], value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.full(shape, value, dtype=dtype, device=device)

        return cls(
            logprob=full((n_rows,), float("nan"), torch.float32),
            rank=full((n_rows,), -1, torch.int32),
            logsumexp=full((n_rows,), float("nan"), torch.float32),
            top_ids=full((n_rows, k_max), -1, torch.int32),
            top_logprobs=full((n_rows, k_max), float("-inf"), torch.float32),
            status=full((n_rows,), 0, torch.int8),
            workspace=ReduceWorkspace.allocate(n_rows, vocab_size, k_max, device, config or ReduceConfig()),
        )

    @property
    def k_max(self) -> int:
        return self.top_ids.shape[1]

    def head(self, n_rows: int) -> LogprobBuffers:
        """Views of the first `n_rows` rows: one allocation serves every (padded) batch size."""
        return _head(self, n_rows, workspace=_head(self.workspace, n_rows))


def _head(obj, n_rows: int, **replaced):
    """A copy of a buffers dataclass with every tensor field cut to its first `n_rows` rows."""
    tensors = {
        f.name: getattr(obj, f.name)[:n_rows]
        for f in dataclasses.fields(obj)
        if isinstance(getattr(obj, f.name), torch.Tensor)
    }
    return dataclasses.replace(obj, **tensors, **replaced)


def reduce_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    num_top: torch.Tensor,
    k_max: int,
    row_mask: torch.Tensor | None = None,
    out: LogprobBuffers | None = None,
    *,
    reference: bool = False,
) -> LogprobBuffers:
    """Per row i (where row_mask[i] is true or nonzero: an integer mask can be a staged input as it is,
    with no kernel to convert it): logsumexp, logprob and 1-based rank of token_ids[i], and
    the num_top[i] (<= k_max, a static int) largest logprobs, value descending then lower id.

    All reductions are fp32 on the exact inputs, in a fixed order (bitwise reproducible,
    independent of N and of the other rows). Masked-off rows are left untouched.
    See `LogprobBuffers` for what status != 0 rows hold. Pass `out` (from
    `LogprobBuffers.allocate`) to reuse buffers and capture the call in a CUDA graph.
    `reference`: the float64 torch path even where Triton runs (`reduce_logprobs_reference`).
    """
    check_inputs(logits, token_ids, num_top, k_max, row_mask)
    n_rows, vocab = logits.shape
    if out is None:
        out = LogprobBuffers.allocate(n_rows, k_max, vocab, logits.device)
    else:
        check_out(out, n_rows, k_max, vocab, logits.device)
    if n_rows == 0:
        return out
    if use_triton(logits) and not reference:
        from qwen3_runtime.ops.logprob_reduce import launch_reduce

        launch_reduce(logits, token_ids, num_top, row_mask, out)
    else:
        reduce_reference(logits, token_ids, num_top, row_mask, out)
    return out


# The same function in float64 torch (any device); for CPUs without Triton, and tests.
reduce_logprobs_reference = functools.partial(reduce_logprobs, reference=True)
