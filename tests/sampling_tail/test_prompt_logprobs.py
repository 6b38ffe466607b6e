"""PromptLogprobs: a prompt scored over the forwards of its chunks, in chunks of logits, every position against the
float64 reference, on both paths; the rows a step samples from ride in the last product."""

import pytest
import torch

from qwen3_runtime.logprobs import token_logprob_from_row
from qwen3_runtime.logprobs.host_path import LogprobsRouting
from qwen3_runtime.params import SamplingParams
from qwen3_runtime.request import Request
from qwen3_runtime.sampling_tail.prompt_logprobs import PromptLogprobs, ScoredSpan
from qwen3_runtime.stats import RunnerStats

VOCAB, HIDDEN = 40, 8


def scorer(path: str, chunk_size: int) -> PromptLogprobs:
    return PromptLogprobs(chunk_size, 64, LogprobsRouting(path, 5), VOCAB, torch.device("cpu"), RunnerStats())


def request(prompt: list[int], k: int | None) -> Request:
    return Request(0, prompt, SamplingParams(max_tokens=1, prompt_logprobs=k), seed=0)


@pytest.mark.parametrize("path", ["device", "host"])
@pytest.mark.parametrize("chunk_size", [1, 3, 64])
def test_a_prompt_scored_in_pieces_equals_the_reference(path, chunk_size):
    """Forwards over tokens [0, 4), [4, 9), [9, 11) of an 11-token prompt, the request's rows after two rows of
    others: position p scores token p + 1 from its own hidden row; the sampled rows' logits come back too."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen)
    prompt = torch.randint(0, VOCAB, (11,), generator=gen).tolist()
    req, scores = request(prompt, 3), scorer(path, chunk_size)
    expected = [None]
    for start, end in [(0, 4), (4, 9), (9, 11)]:
        hidden = torch.randn(2 + end - start, HIDDEN, generator=gen)
        logits = hidden @ weight.T
        span = ScoredSpan.of_chunk(req, 2, start, end)
        device_spans, sampled = scores.compute([span], hidden, lambda h: h @ weight.T, sample_rows=[0, 1])
        scores.unpack(device_spans)
        positions = range(start, min(end, len(prompt) - 1))
        expected += [token_logprob_from_row(logits[2 + p - start].double(), prompt[p + 1], 3) for p in positions]
        if sampled is not None:  # the device path's last product computed them
            torch.testing.assert_close(sampled, logits[:2])
    got = list(req.prompt_logprobs)
    assert len(got) == len(prompt) and got[0] is None and not req.needs_prompt_logprobs
    for g, want in zip(got[1:], expected[1:]):
        assert (g.token_id, g.rank, g.top_ids) == (want.token_id, want.rank, want.top_ids)
        assert g.logprob == pytest.approx(want.logprob, abs=1e-5)
        assert g.top_logprobs == pytest.approx(want.top_logprobs, abs=1e-5)


def test_spans_score_only_positions_with_a_next_prompt_token():
    req = request([5, 6, 7, 8], 1)
    assert (ScoredSpan.of_chunk(req, 0, 0, 4).end, ScoredSpan.of_chunk(req, 0, 0, 4).is_last) == (3, True)
    assert not ScoredSpan.of_chunk(req, 0, 0, 2).is_last
    last_only = ScoredSpan.of_chunk(req, 7, 3, 4)  # the last token scores nothing, but ends the prompt
    assert len(last_only.positions) == 0 and last_only.is_last
    assert ScoredSpan.of_chunk(request([5, 6], None), 0, 0, 2) is None  # no prompt logprobs asked


@pytest.mark.parametrize("path", ["device", "host"])
def test_a_one_token_prompt_has_one_null_entry(path):
    req, scores = request([9], 2), scorer(path, 4)
    span = ScoredSpan.of_chunk(req, 0, 0, 1)
    device_spans, sampled = scores.compute([span], torch.zeros(1, HIDDEN), lambda h: torch.zeros(len(h), VOCAB))
    scores.unpack(device_spans)
    assert list(req.prompt_logprobs) == [None] and sampled is None and req.error is None


@pytest.mark.parametrize("path", ["device", "host"])
def test_non_finite_logits_fail_the_request(path):
    req, scores = request([1, 2, 3], 1), scorer(path, 4)
    nan_logits = lambda h: torch.full((len(h), VOCAB), float("nan"))  # noqa: E731
    device_spans, _ = scores.compute([ScoredSpan.of_chunk(req, 0, 0, 3)], torch.zeros(3, HIDDEN), nan_logits)
    scores.unpack(device_spans)
    assert req.error is not None and list(req.prompt_logprobs) == [None, None, None]
