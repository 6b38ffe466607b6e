"""TailVariant.of: the cheapest sampling tail that serves a batch; every(): the decode graphs' tails in capture
order."""

from dataclasses import replace
from types import SimpleNamespace

from qwen3_runtime import SamplingParams
from qwen3_runtime.sampling_tail.variant import TOP_K_CAP, Sampler, TailVariant

GREEDY = SamplingParams(temperature=0, top_k=5)  # a greedy row's filters: unused
PLAIN = SamplingParams(temperature=0.9, logprobs=3, logprobs_mode="processed")
TOP_P = SamplingParams(temperature=0.9, top_p=0.95)


def sampler(*params: SamplingParams, mode: str = "raw") -> Sampler:
    variant = TailVariant.of([SimpleNamespace(params=p, constrained=False) for p in params], mode)
    assert not variant.penalized
    return variant.sampler


def test_the_sampler_is_the_cheapest_that_serves_every_row():
    assert sampler(GREEDY, GREEDY) == Sampler.GREEDY
    assert sampler(GREEDY, PLAIN) == Sampler.RANDOM
    assert sampler(PLAIN, TOP_P, GREEDY) == Sampler.SELECT
    assert sampler(replace(PLAIN, top_k=3), PLAIN) == Sampler.SELECT
    assert sampler(replace(TOP_P, top_k=TOP_K_CAP + 1)) == Sampler.SORT


def test_top_p_alone_sorts_only_when_its_processed_logprobs_need_the_cutoff():
    assert sampler(replace(TOP_P, logprobs=1, logprobs_mode="processed")) == Sampler.SORT
    assert sampler(replace(TOP_P, logprobs=1), mode="processed") == Sampler.SORT  # the engine's default mode
    assert sampler(TOP_P, mode="processed") == Sampler.SELECT  # no logprobs: nothing written
    assert sampler(replace(TOP_P, top_k=TOP_K_CAP, logprobs=1, logprobs_mode="processed")) == Sampler.SELECT


def test_one_penalized_row_takes_the_batch_through_the_penalties():
    reqs = [SimpleNamespace(params=p, constrained=False) for p in (GREEDY, replace(GREEDY, presence_penalty=0.5))]
    assert TailVariant.of(reqs, "raw") == TailVariant(Sampler.GREEDY, penalized=True)


def test_every_variant_in_the_capture_order():
    assert TailVariant.every() == [
        (sampler, penalized, masked)
        for masked in (False, True)
        for sampler in ("greedy", "random", "select", "sort")
        for penalized in (False, True)
    ]


def test_only_a_batch_with_a_constrained_row_takes_the_mask_pass():
    plain = SimpleNamespace(params=GREEDY, constrained=False)
    constrained = SimpleNamespace(params=GREEDY, constrained=True)
    assert not TailVariant.of([plain, plain], "raw").masked
    assert TailVariant.of([plain, constrained], "raw") == TailVariant(Sampler.GREEDY, False, masked=True)
