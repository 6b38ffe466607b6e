"""The soak replay's comparison: exact outputs pass, a greedy output that leaves the offline one at a near-tie is
compared up to there and counted, a prompt token's rank may move past the tokens within tie_tol of it, any other
difference is a mismatch."""

from types import SimpleNamespace

import pytest

from qwen3_runtime.logprobs.reference import TokenLogprob
from qwen3_runtime.params import RequestLimits
from qwen3_runtime.tokenizer import Tokenizer
from scripts.soak.client import Choice, Result
from scripts.soak.replay import Comparer, Item, engine_inputs
from scripts.soak.workload import Spec

IDS = [785, 3974, 13876, 38835]  # "The quick brown fox"
RUNNER_UP = 4254  # the offline runner-up at the third token


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.builtin_qwen3()


def _offline(gap: float) -> SimpleNamespace:
    """Greedy tokens IDS with their top two; the third token's top two are `gap` apart."""
    lps = [TokenLogprob(t, -1.0, 1, 0.0, [t, 7], [-1.0, -3.0]) for t in IDS]
    lps[2] = TokenLogprob(IDS[2], -1.0, 1, 0.0, [IDS[2], RUNNER_UP], [-1.0, -1.0 - gap])
    return SimpleNamespace(token_ids=IDS, logprobs=lps, finish_reason="length", prompt_logprobs=None)


def _served(tok: Tokenizer, ids: list[int], logprobs: int | None) -> Item:
    body = {"prompt": [1, 2], "max_tokens": len(IDS), "temperature": 0.0, "logprobs": logprobs}
    result = Result(Spec(0, "completions", body, prompt_ids=[1, 2], reproducible=True))
    choice = result.choices[0] = Choice(tok.decode(ids), "length")
    if logprobs is not None:
        strings = tok.token_strings(ids)
        choice.logprobs = {"tokens": strings, "token_logprobs": [-1.0] * len(ids)}
        choice.logprobs["top_logprobs"] = [{s: -1.0} for s in strings]
    [item] = engine_inputs(result, tok, RequestLimits(tok.vocab_size, 64, 5), {})
    return item


def test_greedy_items_ask_the_offline_engine_for_the_runner_up(tok):
    item = _served(tok, IDS, logprobs=1)
    assert item.params.logprobs == 2 and item.asked_logprobs == 1
    assert _served(tok, IDS, logprobs=None).params.logprobs == 2


@pytest.mark.parametrize("logprobs", [None, 1])
def test_divergence_at_a_near_tie_is_counted_not_a_mismatch(tok, logprobs):
    comparer = Comparer(tok, tol=1e-4, tie_tol=1e-3)
    served = IDS[:2] + [RUNNER_UP, 11]
    comparer.compare(_served(tok, served, logprobs), _offline(gap=5e-4))
    assert comparer.mismatches == [] and comparer.diverged == 1 and comparer.tokens == 2


@pytest.mark.parametrize("served, what", [(IDS[:2] + [RUNNER_UP, 11], "text"), (IDS[:3] + [11], "text")])
def test_any_other_difference_is_a_mismatch(tok, served, what):
    comparer = Comparer(tok, tol=1e-4, tie_tol=1e-3)
    comparer.compare(_served(tok, served, None), _offline(gap=0.1))  # no near-tie anywhere
    assert [m.what for m in comparer.mismatches] == [what] and comparer.diverged == 0
    assert comparer.summary() == {"by_field": {what: 1}, "choices_with_any": 1, "choices": 1}


def test_equal_outputs_pass(tok):
    comparer = Comparer(tok, tol=1e-4, tie_tol=1e-3)
    comparer.compare(_served(tok, IDS, 1), _offline(gap=5e-4))
    assert comparer.mismatches == [] and comparer.diverged == 0 and comparer.tokens == len(IDS)


def _scored_prompt(tok: Tokenizer, served_rank: int) -> tuple[Item, SimpleNamespace]:
    """A prompt token of rank 11,501 at logprob -11.7, the top one at -10.7 (a flat distribution's tail), served
    with `served_rank`."""
    item = _served(tok, IDS, None)
    item.result.spec.body["prompt_logprobs"] = 1
    served = {"5": {"logprob": -11.7, "rank": served_rank}, "9": {"logprob": -10.7, "rank": 1}}
    item.result.choices[0].prompt_logprobs = [None, served]
    out = _offline(gap=0.1)
    out.prompt_logprobs = [None, TokenLogprob(5, -11.7, 11501, 0.0, [9], [-10.7])]
    return item, out


@pytest.mark.parametrize(
    "tie_tol, served_rank, ok",
    [(1e-3, 11501, True), (1e-3, 11502, True), (1e-3, 11478, True), (1e-3, 11530, False), (0.0, 11502, False)],
)
def test_a_prompt_tokens_rank_may_move_past_the_tokens_within_tie_tol(tok, tie_tol, served_rank, ok):
    """11,500 tokens above over one unit of logprob: rounding within 1e-3 may carry up to 23 of them across."""
    comparer = Comparer(tok, tol=1e-4, tie_tol=tie_tol)
    comparer.compare(*_scored_prompt(tok, served_rank))
    assert (comparer.mismatches == []) == ok
