"""Each constrained request's grammar state, and the step's host bitmask its row is filled into.

A `ConstraintMatcher` wraps xgrammar's GrammarMatcher for one request: `accept` advances it by every token the
request emits, `fill` writes its row of the bitmask [rows, ceil(V/32)] int32 (bit t % 32 of word t // 32 set: token
t allowed), which the engine copies to the device and ops/grammar_mask.py applies to the logits.

- Reasoning: with a reasoning parser the constraint holds for the answer alone. A matcher made with
  `activate_after=151668` (</think>) is inactive until that token is emitted: meanwhile it does not advance and
  its row is all ones. Without one (completions, or a prompt that already closed the think block) it is active from
  the first token.
- A rejected token (`accept` returns False; the matcher's state is unchanged) can only come from a row sampled
  without its mask, since the mask makes every other token -inf: an engine fault, not the model's. The engine ends
  the request with finish_reason "error", keeping the tokens before it (a valid prefix of the grammar).
- Terminated (a stop token accepted where the grammar may end): the row is all zeros, so every logit of it is -inf
  and the sampler flags the row as not finite, which fails that request alone. The engine ends the request on the
  stop token, so such a row is only sampled where it is discarded (the step after a stop, with async scheduling).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np
import torch
import xgrammar as xgr

ALL_ONES = -1  # an int32 word with every bit set


def bitmask_width(vocab_size: int) -> int:
    """Words a bitmask row holds: ceil(vocab_size / 32)."""
    return -(-vocab_size // 32)


class ConstraintMatcher:
    """One request's position in its grammar (module docstring: activation, rejection, termination)."""

    def __init__(self, grammar: xgr.CompiledGrammar, activate_after: int | None = None) -> None:
        self._matcher = xgr.GrammarMatcher(grammar)
        self.activate_after = activate_after
        self.active = activate_after is None

    @property
    def terminated(self) -> bool:
        """Whether the grammar has accepted a stop token: it takes no more tokens."""
        return self.active and self._matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        """Advance by an emitted token; False: the grammar does not allow it here (module docstring)."""
        if not self.active:
            self.active = token_id == self.activate_after
            return True
        if self._matcher.is_terminated():  # xgrammar would log a warning for every such call
            return False
        return self._matcher.accept_token(token_id)

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write this request's next-token mask into bitmask[row] (int32 [rows, ceil(V/32)], C-contiguous)."""
        if not self.active:
            bitmask[row] = ALL_ONES
        elif self._matcher.is_terminated():
            bitmask[row] = 0
        else:
            self._matcher.fill_next_token_bitmask(bitmask, row)


def _default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) // 2)


@dataclasses.dataclass
class HostBitmask:
    """The step's bitmask on the host: `tensor` (pinned when CUDA is there, so its copy to the device can be
    asynchronous) and `array`, its NumPy view, which xgrammar fills (a few µs a row faster than through torch's
    DLPack export). `fill` does many rows at once in `threads` of xgrammar's own threads."""

    tensor: torch.Tensor
    threads: int = dataclasses.field(default_factory=_default_threads)
    array: np.ndarray = dataclasses.field(init=False)
    _batch: xgr.BatchGrammarMatcher = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        assert self.tensor.dtype == torch.int32 and self.tensor.dim() == 2 and self.tensor.is_contiguous()
        self.array = self.tensor.numpy()
        self._batch = xgr.BatchGrammarMatcher(self.threads)

    @classmethod
    def allocate(cls, rows: int, vocab_size: int, *, pin: bool | None = None, **kw: int) -> HostBitmask:
        """An all-ones bitmask [rows, ceil(vocab_size / 32)]; pinned where CUDA is available unless `pin` says."""
        pin = torch.cuda.is_available() if pin is None else pin
        shape = (rows, bitmask_width(vocab_size))
        return cls(torch.full(shape, ALL_ONES, dtype=torch.int32, pin_memory=pin), **kw)

    def fill_all_ones(self, rows: slice | Sequence[int]) -> None:
        """Every token allowed in `rows` (unconstrained requests): one vectorised write."""
        self.array[rows] = ALL_ONES

    def fill(self, rows: Sequence[int], matchers: Sequence[ConstraintMatcher]) -> None:
        """matchers[i]'s mask into row rows[i]: the inactive ones all ones and the terminated ones all zeros (a
        vectorised write each), the others by xgrammar in parallel."""
        ones, zeros, live_rows, live = [], [], [], []
        for row, matcher in zip(rows, matchers, strict=True):
            if not matcher.active:
                ones.append(row)
            elif matcher._matcher.is_terminated():
                zeros.append(row)
            else:
                live_rows.append(row)
                live.append(matcher._matcher)
        self.array[ones] = ALL_ONES
        self.array[zeros] = 0
        if len(live) == 1:
            live[0].fill_next_token_bitmask(self.array, live_rows[0])
        elif live:
            self._batch.batch_fill_next_token_bitmask(live, self.array, live_rows)

    def hold_end(self, row: int, token_ids: Sequence[int]) -> None:
        """Ban `token_ids` (min_tokens' stop ids) in `row`, unless they are all it allows: the grammar can then
        only end, and banning them would leave nothing to sample."""
        words = self.array[row].view(np.uint32)
        ids = np.asarray(token_ids, dtype=np.int64)
        kept = words[ids // 32]  # a copy
        np.bitwise_and.at(words, ids // 32, ~np.left_shift(np.uint32(1), (ids % 32).astype(np.uint32)))
        if not words.any():
            words[ids // 32] = kept
