"""Host reference for one row's log-probabilities, in float64.

This is the ground truth the device reduction is tested against, and the
"host path" the benchmark compares with. It is deliberately plain: every
number comes from float64 NumPy on the exact input values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class TokenLogprob:
    """Log-probabilities of one row (all floats are Python floats from float64 math).

    `top_ids` / `top_logprobs` are Python lists of length k, ordered by value
    descending, ties by lower token id. `rank` is the 1-based position of
    `token_id` in that same order over the whole vocabulary.
    """

    token_id: int
    logprob: float
    rank: int
    logsumexp: float
    top_ids: list[int]
    top_logprobs: list[float]

    def __reduce__(self) -> tuple:
        # Rebuilt from its fields in order: unpickles several times faster than a slotted dataclass's default
        # (the server's API process unpickles every step's logprobs).
        return TokenLogprob, (self.token_id, self.logprob, self.rank, self.logsumexp, self.top_ids, self.top_logprobs)


def _as_float64(row) -> np.ndarray:
    """A float64 copy of a NumPy array or a (CPU or device) torch tensor of any float dtype."""
    if hasattr(row, "detach"):  # torch tensor; bf16 has no NumPy dtype, so widen in torch
        import torch

        return row.detach().to("cpu", torch.float64).numpy()
    return np.asarray(row, dtype=np.float64)


def _check_row(x: np.ndarray, token_id: int, k: int) -> None:
    """Raise ValueError for inputs the device reports with status 1 or 2 (same precedence: row first)."""
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"row must be a non-empty 1-D array, got shape {x.shape}")
    vocab = x.size
    if k < -1 or k > vocab:
        raise ValueError(f"k={k} is outside [-1, {vocab}]")
    if np.isnan(x).any():
        raise ValueError("row contains NaN")
    if np.isposinf(x).any():
        raise ValueError("row contains +inf")
    if np.isneginf(x).all():
        raise ValueError("row is entirely -inf")
    if not 0 <= token_id < vocab:
        raise ValueError(f"token_id={token_id} is outside [0, {vocab})")


def _top_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values, value descending then id ascending (exact under ties)."""
    vocab = x.size
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if k == vocab:
        return np.lexsort((np.arange(vocab), -x))
    kth_value = np.partition(x, vocab - k)[vocab - k]
    candidates = np.flatnonzero(x >= kth_value)  # every tie at the k-th value, lowest ids first
    order = np.lexsort((candidates, -x[candidates]))
    return candidates[order[:k]]


def token_logprob_from_row(row, token_id: int, k: int) -> TokenLogprob:
    """Logprob, rank and top-k of `token_id` in one row of logits; k = -1 means the whole vocabulary.

    lse = max + log(sum(exp(row - max))); logprob = row[token_id] - lse.
    Raises ValueError (naming the problem) for a bad shape, k outside [-1, V],
    a row with NaN or +inf or only -inf, or token_id outside [0, V).
    """
    x = _as_float64(row)
    token_id, k = int(token_id), int(k)
    _check_row(x, token_id, k)
    x = x + 0.0  # -0.0 becomes +0.0 so the two tie, as they do as floats
    vocab = x.size
    if k == -1:
        k = vocab
    peak = x.max()
    lse = float(peak + np.log(np.exp(x - peak).sum()))
    target = x[token_id]
    ids = np.arange(vocab)
    rank = 1 + int((x > target).sum()) + int(((x == target) & (ids < token_id)).sum())
    top = _top_ids(x, k)
    return TokenLogprob(
        token_id=token_id,
        logprob=float(target - lse),
        rank=rank,
        logsumexp=lse,
        top_ids=[int(i) for i in top],
        top_logprobs=[float(v) for v in x[top] - lse],
    )
