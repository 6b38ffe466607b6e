import math

import numpy as np
import pytest

from qwen3_runtime.validation import (
    as_float,
    as_int,
    check_choice,
    check_float,
    check_int,
    check_range,
    check_text,
    check_token_ids,
    plain_token_ids,
)


def test_numpy_scalars_become_python_numbers():
    assert type(as_int("n", np.int64(3))) is int and as_int("n", np.uint8(7)) == 7
    assert type(as_float("x", np.float32(0.5))) is float and as_float("x", np.float32(0.5)) == 0.5
    assert type(as_float("x", 2)) is float and type(as_float("x", np.int32(2))) is float


@pytest.mark.parametrize("value", [True, np.bool_(True), 1.0, np.float64(1.0), "1", None, [1]])
def test_only_integers_are_integers(value):
    with pytest.raises(ValueError, match=r"^n=.* is invalid: expected an integer$"):
        as_int("n", value)


@pytest.mark.parametrize("value", [False, "0.5", None, np.array([0.5])])
def test_only_numbers_are_numbers(value):
    with pytest.raises(ValueError, match=r"^x=.* is invalid: expected a number$"):
        as_float("x", value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_non_finite_numbers_fail_any_range(value):
    with pytest.raises(ValueError, match=r"^x=-?(nan|inf) is invalid: expected a finite number$"):
        check_float("x", value, lo=0)
    with pytest.raises(ValueError, match="expected a finite number"):
        check_range("x", float(value))  # even without bounds


@pytest.mark.parametrize(
    "bounds, value, text",
    [
        ({"lo": 1}, 0, "n=0 is out of range: must be >= 1"),
        ({"lo": 0, "lo_open": True}, 0, "n=0 is out of range: must be > 0"),
        ({"hi": 4}, 5, "n=5 is out of range: must be <= 4"),
        ({"lo": 0, "hi": 1, "lo_open": True}, 1.5, "n=1.5 is out of range: must be in (0, 1]"),
        ({"lo": 0, "hi": 8, "hi_open": True}, 8, "n=8 is out of range: must be in [0, 8)"),
        ({"lo": 0, "note": "why"}, -1, "n=-1 is out of range: must be >= 0 (why)"),
    ],
)
def test_one_message_shape_for_ranges(bounds, value, text):
    with pytest.raises(ValueError) as err:
        check_range("n", value, **bounds)
    assert str(err.value) == text
    check_range("n", 0.5 if "hi" in bounds else 10, **{k: v for k, v in bounds.items() if k != "note"})


def test_huge_integers_are_compared_not_converted():
    with pytest.raises(ValueError, match="must be in"):
        check_int("seed", 10**400, lo=0, hi=2**63 - 1)


def test_token_ids():
    assert check_token_ids("p", (np.int64(3), 4), vocab_size=5) == [3, 4]
    with pytest.raises(ValueError, match=r"^p\[1\]=5 is out of range: must be in \[0, 5\)$"):
        check_token_ids("p", [1, 5], vocab_size=5)
    with pytest.raises(ValueError, match=r"^p\[0\]=True is invalid: expected an integer$"):
        check_token_ids("p", [True])
    with pytest.raises(ValueError, match="expected a list of token ids, got ndarray"):
        check_token_ids("p", np.arange(1000))


def test_choice():
    check_choice("mode", "raw", ("raw", "processed"))
    with pytest.raises(ValueError, match=r"^mode='x' is invalid: allowed values are raw, processed$"):
        check_choice("mode", "x", ("raw", "processed"))
    with pytest.raises(ValueError, match="allowed values"):
        check_choice("mode", np.array(["raw", "raw"]), ("raw", "processed"))


def test_plain_token_ids_of_a_rejected_prompt():
    assert plain_token_ids((np.int64(1), -1)) == [1, -1] and type(plain_token_ids([np.int64(1)])[0]) is int
    assert plain_token_ids("ab") == [] == plain_token_ids([None]) == plain_token_ids(np.arange(3))


def test_text_with_an_unpaired_surrogate_is_not_text():
    assert check_text("prompt", "héllo 🙂") == "héllo 🙂"
    with pytest.raises(
        ValueError, match=r"^prompt is not valid text: it holds an unpaired surrogate U\+DCFF at index 1 "
    ):
        check_text("prompt", "a\udcffb")
