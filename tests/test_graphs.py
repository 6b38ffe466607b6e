import pytest
import torch

from graphs import StepGraphs, default_buckets, token_buckets


def test_default_buckets():
    assert default_buckets(1) == [1]
    assert default_buckets(6) == [1, 2, 4, 6]
    assert default_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert default_buckets(20) == [1, 2, 4, 8, 16, 20]


def test_token_buckets():
    assert token_buckets(1) == [1] and token_buckets(20) == [16, 20]
    buckets = token_buckets(1500)
    assert buckets[:3] == [16, 32, 48] and buckets[15:18] == [256, 320, 384] and buckets[-3:] == [1024, 1280, 1500]


def test_padding_and_eager_fallback():
    calls = []
    graphs = StepGraphs(lambda batch, variant: calls.append((batch, variant)) or batch, [1, 2, 4, 8], ["a", "b"])
    assert [graphs.padded_size(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 9]
    assert graphs.run(3, "b") == 4
    assert graphs.run(11, "a") == 11  # over the largest bucket: eager, unpadded
    assert calls == [(4, "b"), (11, "a")]
    with pytest.raises(ValueError, match="buckets"):
        StepGraphs(lambda b, v: None, [])


def test_variants_may_differ_by_bucket():
    calls = []
    long_in_small = lambda bucket: ["short", "long"] if bucket <= 2 else ["short"]  # noqa: E731
    graphs = StepGraphs(lambda batch, variant: calls.append((batch, variant)) or batch, [1, 2, 8], long_in_small)
    assert graphs.variants_of(2) == ["short", "long"] and graphs.variants_of(8) == ["short"]
    assert graphs.run(2, "long") == 2 and graphs.run(5, "short") == 8
    assert calls == [(2, "long"), (8, "short")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_variant_of_some_buckets_is_captured_for_those_only():
    x = torch.arange(8.0, device="cuda")

    graphs = StepGraphs(
        lambda batch, variant: x[:batch] * len(variant), [2, 8], lambda b: ["ab", "abc"] if b == 2 else ["ab"]
    )
    graphs.capture()
    assert set(graphs.graphs) == {(2, "ab"), (2, "abc"), (8, "ab")}
    assert graphs.run(1, "abc").tolist() == [0.0, 3.0] and graphs.run(5, "ab").tolist() == [2.0 * i for i in range(8)]
    with pytest.raises(KeyError, match="not captured for 8 rows"):
        graphs.run(5, "abc")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replay_reads_the_current_inputs():
    x = torch.zeros(8, 16, device="cuda")
    y = torch.zeros(8, 16, device="cuda")

    def step(batch, variant):
        y[:batch].copy_(x[:batch] * 2 + (1 if variant == "plus" else 0))
        return y[:batch].sum(dim=1)

    graphs = StepGraphs(step, [2, 8], ["plain", "plus"])
    graphs.capture()
    for rows, variant in ((1, "plain"), (5, "plus"), (2, "plus")):
        x.copy_(torch.randn_like(x))
        batch, out = graphs.padded_size(rows), graphs.run(rows, variant)
        expected = (x[:batch] * 2 + (variant == "plus")).sum(dim=1)
        torch.testing.assert_close(out, expected)
    with pytest.raises(KeyError, match="not captured"):  # never a silent eager run in place of a replay
        graphs.run(2, "minus")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_variants_left_out_of_the_first_capture_are_captured_by_a_later_one():
    """The runner captures rarely needed variants (structured outputs' masked tail) on first need: until then a
    replay of one is refused, after it replays, and the first capture's graphs stay."""
    x = torch.arange(8.0, device="cuda")
    graphs = StepGraphs(lambda batch, variant: x[:batch] * len(variant), [2, 8], ["a", "bb"])
    graphs.capture(lambda variant: variant != "bb")
    assert set(graphs.graphs) == {(2, "a"), (8, "a")}
    with pytest.raises(KeyError, match="not captured for 2 rows"):
        graphs.run(2, "bb")
    first = graphs.graphs[(8, "a")]
    graphs.capture(lambda variant: variant == "bb")
    assert set(graphs.graphs) == {(2, "a"), (8, "a"), (2, "bb"), (8, "bb")} and graphs.graphs[(8, "a")] is first
    assert graphs.run(1, "bb").tolist() == [0.0, 2.0] and graphs.run(5, "a").tolist() == list(range(8))
