"""GrammarRows: the step's bitmask and mask_row staged from the batch's requests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from qwen3_runtime.sampling_tail.grammar_rows import GrammarRows
from qwen3_runtime.structured import OutputConstraint
from qwen3_runtime.tokenizer import Tokenizer

pytest.importorskip("xgrammar")
VOCAB = 151936


def test_constrained_rows_are_packed_and_the_others_take_no_mask():
    from qwen3_runtime.structured.compiler import ConstraintCompiler
    from qwen3_runtime.structured.matcher import ConstraintMatcher

    compiler = ConstraintCompiler(Tokenizer.builtin_qwen3(), VOCAB, (151645,))
    matcher = ConstraintMatcher(compiler.compile(OutputConstraint.choice(["yes"])))
    compiler.close()
    plain = SimpleNamespace(constrained=False, matcher=None)
    constrained = SimpleNamespace(constrained=True, matcher=matcher)
    rows = GrammarRows(4, VOCAB, torch.device("cpu"))
    rows.bitmask.fill_(0)  # poisoned: only the constrained row may be written
    rows.stage([plain, constrained, plain], padded_rows=4)
    assert rows.mask_row.tolist() == [-1, 0, -1, -1]  # padding too
    allowed = ((rows.bitmask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:VOCAB]
    assert 0 < int(allowed.sum()) < 10  # the first tokens of "yes"


def test_an_unconstrained_rows_bitmask_is_all_ones():
    rows = GrammarRows(2, VOCAB, torch.device("cpu"))
    assert bool((rows.bitmask == -1).all()) and rows.mask_row.tolist() == [-1, -1]
