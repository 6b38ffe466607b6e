"""GrammarRows: the step's bitmask and mask_row staged from the batch's requests, in one copy; min_tokens of a
constrained request held by its mask row."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from qwen3_runtime.params import SamplingParams
from qwen3_runtime.sampling_tail.grammar_rows import GrammarRows
from qwen3_runtime.structured import OutputConstraint
from qwen3_runtime.tokenizer import Tokenizer

pytest.importorskip("xgrammar")
VOCAB = 151936
EOS = (151645, 151643)


@pytest.fixture(scope="module")
def matcher_of():
    from qwen3_runtime.structured.compiler import ConstraintCompiler
    from qwen3_runtime.structured.matcher import ConstraintMatcher

    compiler = ConstraintCompiler(Tokenizer.builtin_qwen3(), VOCAB, EOS)
    yield lambda constraint: ConstraintMatcher(compiler.compile(constraint))
    compiler.close()


def request(matcher=None, min_tokens: int = 0) -> SimpleNamespace:
    params = SamplingParams(max_tokens=16, min_tokens=min_tokens)
    return SimpleNamespace(constrained=matcher is not None, matcher=matcher, params=params)


def allowed(rows: GrammarRows, row: int) -> set[int]:
    bits = ((rows.bitmask[row, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:VOCAB]
    return set(torch.nonzero(bits).flatten().tolist())


def test_constrained_rows_are_packed_and_the_others_take_no_mask(matcher_of):
    rows = GrammarRows(4, VOCAB, EOS, torch.device("cpu"))
    rows.bitmask.fill_(0)  # poisoned: only the constrained row may be written
    rows.stage([request(), request(matcher_of(OutputConstraint.choice(["yes"]))), request()], [0, 0, 0], 4)
    assert rows.mask_row.tolist() == [-1, 0, -1, -1]  # padding too
    assert 0 < len(allowed(rows, 0)) < 10  # the first tokens of "yes"
    assert not allowed(rows, 1)  # rows past the constrained ones are not copied


def test_an_unconstrained_rows_bitmask_is_all_ones():
    rows = GrammarRows(2, VOCAB, EOS, torch.device("cpu"))
    assert bool((rows.bitmask == -1).all()) and rows.mask_row.tolist() == [-1, -1]


def test_min_tokens_bans_the_stop_ids_until_reached_unless_the_grammar_can_only_end(matcher_of):
    tok = Tokenizer.builtin_qwen3()
    going_on, ending = matcher_of(OutputConstraint.regex(r"[a-c]+")), matcher_of(OutputConstraint.choice(["yes"]))
    for matcher, text in ((going_on, "ab"), (ending, "yes")):
        assert all(matcher.accept(t) for t in tok.encode(text))
    rows = GrammarRows(4, VOCAB, EOS, torch.device("cpu"))
    reqs = [request(going_on, min_tokens=3), request(going_on, min_tokens=2), request(ending, min_tokens=9)]
    rows.stage(reqs, [2, 2, 1], 4)  # the first is short of its min_tokens; the second has reached it
    assert not allowed(rows, 0) & set(EOS) and allowed(rows, 0) == allowed(rows, 1) - set(EOS)
    assert set(EOS) <= allowed(rows, 1)
    assert allowed(rows, 2) == set(EOS)  # the grammar's end comes, min_tokens or not
