"""The float64 host reference `token_logprob_from_row`."""

import math
import re

import numpy as np
import pytest
import torch

from qwen3_runtime.logprobs import TokenLogprob, token_logprob_from_row


def brute_force(row: list[float], token_id: int, k: int) -> TokenLogprob:
    """The definition, spelled out with Python floats and a full sort."""
    lse = math.log(sum(math.exp(v) for v in row))
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))
    top = order if k == -1 else order[:k]
    return TokenLogprob(token_id, row[token_id] - lse, order.index(token_id) + 1, lse, top, [row[i] - lse for i in top])


def test_small_row_by_hand():
    got = token_logprob_from_row(np.array([1.0, 3.0, 2.0]), token_id=2, k=2)
    lse = math.log(math.e + math.e**3 + math.e**2)
    assert got.logsumexp == pytest.approx(lse, abs=1e-15)
    assert got.logprob == pytest.approx(2.0 - lse, abs=1e-15)
    assert got.rank == 2
    assert got.top_ids == [1, 2]
    assert got.top_logprobs == pytest.approx([3.0 - lse, 2.0 - lse], abs=1e-15)


@pytest.mark.parametrize("seed", range(5))
def test_matches_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    row = rng.integers(-3, 3, size=40).astype(np.float64) / 2  # few distinct values
    for token_id in (0, 7, 39):
        for k in (-1, 0, 1, 5, 40):
            want = brute_force(row.tolist(), token_id, k)
            got = token_logprob_from_row(row, token_id, k)
            assert (got.rank, got.top_ids) == (want.rank, want.top_ids)
            assert got.logprob == pytest.approx(want.logprob, abs=1e-12)
            assert got.top_logprobs == pytest.approx(want.top_logprobs, abs=1e-12)


def test_rank_of_a_token_inside_the_top_k_is_its_position_plus_one():
    row = np.array([5.0, 1.0, 5.0, 7.0, 5.0])
    got = token_logprob_from_row(row, token_id=2, k=4)
    assert got.top_ids == [3, 0, 2, 4]
    assert got.rank == got.top_ids.index(2) + 1 == 3


def test_whole_vocabulary_and_empty_top():
    row = np.array([0.5, -1.0, 2.0, 0.5])
    assert token_logprob_from_row(row, 1, -1).top_ids == [2, 0, 3, 1]
    got = token_logprob_from_row(row, 1, 0)
    assert got.top_ids == [] and got.top_logprobs == []


def test_minus_inf_entries_and_token_at_minus_inf():
    row = np.array([-np.inf, 1.0, -np.inf, 0.0, -np.inf])
    got = token_logprob_from_row(row, token_id=2, k=4)
    assert got.logprob == -np.inf
    assert got.rank == 4  # behind 1.0, 0.0 and the -inf at id 0
    assert got.top_ids == [1, 3, 0, 2]
    assert got.top_logprobs[2:] == [-np.inf, -np.inf]


def test_negative_zero_ties_positive_zero():
    got = token_logprob_from_row(np.array([0.0, -0.0, 0.0]), token_id=2, k=3)
    assert got.top_ids == [0, 1, 2] and got.rank == 3


def test_large_offsets_keep_precision():
    row = np.array([1e4, 1e4 + 1.0, 1e4 - 2.0])
    got = token_logprob_from_row(row, 1, 3)
    shifted = token_logprob_from_row(row - 1e4, 1, 3)
    assert got.logprob == pytest.approx(shifted.logprob, abs=1e-11)


@pytest.mark.parametrize(
    "make",
    [
        lambda v: torch.tensor(v, dtype=torch.bfloat16),
        lambda v: torch.tensor(v, dtype=torch.float32),
        lambda v: np.array(v, dtype=np.float16),
    ],
)
def test_float_dtypes_are_widened_exactly(make):
    values = [0.1, 2.5, -3.75, 2.5]
    row = make(values)
    exact = torch.as_tensor(row).double().tolist() if not isinstance(row, np.ndarray) else row.astype(np.float64)
    want = token_logprob_from_row(np.array(exact), 3, 2)
    got = token_logprob_from_row(row, 3, 2)
    assert got == want
    assert got.top_ids == [1, 3] and got.rank == 2


@pytest.mark.parametrize(
    "row, token_id, k, message",
    [
        (np.zeros(5), 7, 1, "token_id=7 is outside [0, 5)"),
        (np.zeros(5), -1, 1, "token_id=-1 is outside [0, 5)"),
        (np.zeros(5), 0, -2, "k=-2 is outside [-1, 5]"),
        (np.zeros(5), 0, 6, "k=6 is outside [-1, 5]"),
        (np.zeros(0), 0, 0, "non-empty 1-D"),
        (np.zeros((2, 3)), 0, 0, "non-empty 1-D"),
        (np.array([0.0, np.nan]), 0, 1, "NaN"),
        (np.array([0.0, np.inf]), 0, 1, "+inf"),
        (np.full(3, -np.inf), 0, 1, "entirely -inf"),
    ],
)
def test_errors_name_the_problem(row, token_id, k, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        token_logprob_from_row(row, token_id, k)


def test_bad_row_is_reported_before_bad_token():
    """Same precedence as the device status: 1 (row) before 2 (token)."""
    with pytest.raises(ValueError, match="NaN"):
        token_logprob_from_row(np.array([np.nan, 0.0]), 9, 1)
