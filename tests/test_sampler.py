import torch

from qwen3_runtime.sampler import SamplingTensors, gumbel_noise, processed_logits, sample


def _params(n, temperature=1.0, top_k=-1, top_p=1.0, seed=0):
    full = lambda v, dtype: torch.full((n,), v, dtype=dtype)
    return SamplingTensors(
        full(temperature, torch.float32),
        full(top_k, torch.int32),
        full(top_p, torch.float32),
        torch.arange(n, dtype=torch.int64) + seed,
        torch.full((n,), 5, dtype=torch.int64),
    )


def test_greedy_ties_go_to_the_lower_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [-float("inf"), 2.0, 2.0, 2.0]])
    params = _params(2, temperature=0.0)
    assert torch.equal(processed_logits(logits, params), logits)
    assert sample(logits, params).tolist() == [1, 1]


def test_noise_is_a_function_of_seed_position_and_token():
    seed, pos = torch.tensor([7, 7, 8]), torch.tensor([3, 4, 3])
    noise = gumbel_noise(seed, pos, 1000)
    assert torch.equal(noise, gumbel_noise(seed, pos, 1000))
    assert torch.equal(noise[0, :10], gumbel_noise(seed[:1], pos[:1], 10)[0])
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    assert torch.isfinite(noise).all()
    # Gumbel(0, 1): mean ~ 0.5772, variance ~ pi^2 / 6.
    assert abs(noise.mean().item() - 0.5772) < 0.05 and abs(noise.var().item() - 1.645) < 0.1


def test_sampling_follows_the_softmax_and_the_filters():
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0]).repeat(20000, 1)
    draw = lambda **kw: sample(processed_logits(logits, _params(20000, **kw)), _params(20000, **kw))
    counts = torch.bincount(draw(), minlength=5).float() / 20000
    torch.testing.assert_close(counts, logits[0].softmax(0), atol=0.015, rtol=0)
    assert set(draw(top_k=2).tolist()) == {0, 1}
    # Mass of the first token is 0.64: top_p 0.6 keeps it alone, 0.7 adds the second.
    assert set(draw(top_p=0.6).tolist()) == {0}
    assert set(draw(top_p=0.7).tolist()) == {0, 1}
    hot = draw(temperature=100.0)
    assert torch.bincount(hot, minlength=5).min() > 3000


def test_processed_logits_scale_and_filter_random_rows_only():
    logits = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]])
    params = _params(2, temperature=0.5, top_k=2)
    params.temperature[1] = 0.0
    out = processed_logits(logits, params)
    assert out[0].tolist() == [4.0, 2.0, float("-inf")] and out[1].tolist() == [2.0, 1.0, 0.0]
