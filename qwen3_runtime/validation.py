"""Checkers shared by request parameters and configuration, so a bad value reads the same everywhere:

    top_p=1.5 is out of range: must be in (0, 1]
    temperature=nan is invalid: expected a finite number
    prompt='hello' is invalid: expected a list of token ids, got str

Each raises ValueError naming the field (or dotted key), the value and what is allowed, and returns
the value as a plain Python int / float / list, so NumPy scalars work wherever Python numbers do.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable
from typing import Any

import numpy as np

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def show(value: object) -> str:
    """repr, shortened: a wrong-typed value may be a large array."""
    return _repr.repr(value)


def invalid(name: str, value: object, expected: str) -> ValueError:
    return ValueError(f"{name}={show(value)} is invalid: expected {expected}")


def as_int(name: str, value: object) -> int:
    """A Python or NumPy integer as an int; a bool is not an integer."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise invalid(name, value, "an integer")


def as_float(name: str, value: object) -> float:
    """A Python or NumPy int or float as a float (not yet checked to be finite)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value)
    raise invalid(name, value, "a number")


def as_bool(name: str, value: object) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise invalid(name, value, "true or false")


def check_range(
    name: str,
    value: float,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    note: str = "",
) -> None:
    """Raise unless lo <= value <= hi (strict on an open side); NaN and inf never pass, as every
    comparison with NaN is false and so would let it through."""
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid(name, value, "a finite number")
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and (value >= hi if hi_open else value > hi)
    if too_low or too_high:
        note = f" ({note})" if note else ""
        raise ValueError(f"{name}={show(value)} is out of range: must be {_bounds(lo, hi, lo_open, hi_open)}{note}")


def _bounds(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    return f"{'<' if hi_open else '<='} {hi}"


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None, note: str = "") -> int:
    number = as_int(name, value)
    check_range(name, number, lo, hi, note=note)
    return number


def check_float(name: str, value: object, lo: float | None = None, hi: float | None = None, **options: Any) -> float:
    number = as_float(name, value)
    check_range(name, number, lo, hi, **options)
    return number


def check_choice(name: str, value: object, choices: Iterable[object]) -> None:
    choices = tuple(choices)
    if not any(isinstance(value, type(c)) and value == c for c in choices):
        raise ValueError(f"{name}={show(value)} is invalid: allowed values are {', '.join(map(str, choices))}")


def check_token_ids(name: str, value: object, vocab_size: int | None = None) -> list[int]:
    """A list or tuple of token ids as a new list of ints, each in [0, vocab_size). Arrays and tensors are
    refused rather than guessed at (vLLM takes lists only): say which type came instead."""
    if not isinstance(value, (list, tuple)):
        raise invalid(name, value, f"a list of token ids, got {type(value).__name__}")
    ids = [as_int(f"{name}[{i}]", tok) for i, tok in enumerate(value)]
    for i, tok in enumerate(ids):
        check_range(f"{name}[{i}]", tok, 0, vocab_size, hi_open=True)
    return ids


def is_text(text: str) -> bool:
    """Whether the tokenizer (and UTF-8) can take `text`: no unpaired surrogate, which is what bytes that are not
    UTF-8 become in Python's arguments and file names (surrogateescape) and what JSON's "\\ud800" decodes to."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(name: str, text: str) -> str:
    """`text` if it `is_text`; else a ValueError naming `name` and where the first unpaired surrogate is."""
    if not is_text(text):
        bad = next(i for i, c in enumerate(text) if not is_text(c))
        raise ValueError(
            f"{name} is not valid text: it holds an unpaired surrogate U+{ord(text[bad]):04X} at index {bad} "
            "(bytes that are not UTF-8?)"
        )
    return text


def plain_token_ids(value: object) -> list[int]:
    """`value` as a list of ints when it is a list or tuple of integers (in range or not), else []:
    the prompt a rejected request's output reports (plain data, as every output is)."""
    try:
        return [as_int("prompt", tok) for tok in value] if isinstance(value, (list, tuple)) else []
    except ValueError:
        return []
