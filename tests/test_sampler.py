import torch

from qwen3_runtime.sampler import SamplingTensors, gumbel_noise, sample


def _params(n, temperature=1.0, top_k=-1, top_p=1.0, seed=0):
    full = lambda v, dtype: torch.full((n,), v, dtype=dtype)
    return SamplingTensors(full(temperature, torch.float32), full(top_k, torch.int32), full(top_p, torch.float32),
                           torch.arange(n, dtype=torch.int64) + seed, torch.full((n,), 5, dtype=torch.int64))


def test_greedy_ties_go_to_the_lower_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [-float("inf"), 2.0, 2.0, 2.0]])
    assert sample(logits, _params(2, temperature=0.0), False, False).tolist() == [1, 1]


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
    counts = torch.bincount(sample(logits, _params(20000), True, False), minlength=5).float() / 20000
    torch.testing.assert_close(counts, logits[0].softmax(0), atol=0.015, rtol=0)
    top2 = sample(logits, _params(20000, top_k=2), True, True)
    assert set(top2.tolist()) == {0, 1}
    # Mass of the first token is 0.64: top_p 0.6 keeps it alone, 0.7 adds the second.
    assert set(sample(logits, _params(20000, top_p=0.6), True, True).tolist()) == {0}
    assert set(sample(logits, _params(20000, top_p=0.7), True, True).tolist()) == {0, 1}
    hot = sample(logits, _params(20000, temperature=100.0), True, False)
    assert torch.bincount(hot, minlength=5).min() > 3000
