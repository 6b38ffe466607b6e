"""Shared by the structured-output tests: Qwen3's real tokenizer, a compiler over the model's padded vocabulary
(151,936 ids), and helpers that read a bitmask row as the set of tokens it allows. Nothing here imports xgrammar
until a fixture needs it (test_spec.py runs without it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest

from qwen3_runtime.tokenizer import Tokenizer

if TYPE_CHECKING:
    from qwen3_runtime.structured.compiler import ConstraintCompiler
    from qwen3_runtime.structured.matcher import ConstraintMatcher

VOCAB = 151936  # Qwen3's embedding rows; the tokenizer knows 151,669 ids
WIDTH = VOCAB // 32
EOS = (151645, 151643)  # <|im_end|>, <|endoftext|>
THINK_END = 151668


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    return Tokenizer.builtin_qwen3()


@pytest.fixture(scope="session")
def compiler(tok: Tokenizer) -> Iterator[ConstraintCompiler]:
    from qwen3_runtime.structured.compiler import ConstraintCompiler

    built = ConstraintCompiler(tok, VOCAB, EOS)
    yield built
    built.close()


def allowed(matcher: ConstraintMatcher) -> np.ndarray:
    """The ids the matcher's next-token mask allows, ascending."""
    row = np.zeros((1, WIDTH), dtype=np.int32)
    matcher.fill(row, 0)
    return allowed_ids(row[0])


def allowed_ids(row: np.ndarray) -> np.ndarray:
    """The token ids whose bit is set in one bitmask row (bit t % 32 of word t // 32)."""
    bits = np.unpackbits(np.ascontiguousarray(row, dtype="<i4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:VOCAB])


def drive(matcher: ConstraintMatcher, ids: list[int]) -> None:
    """Feed `ids`, checking each is allowed by the mask before it and accepted."""
    for i in ids:
        assert i in allowed(matcher), i
        assert matcher.accept(i), i
