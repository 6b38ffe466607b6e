import pytest
import torch

from qwen3_runtime import ops
from qwen3_runtime.order_keys import order_keys_reference
from qwen3_runtime.sampler import (
    GREEDY_BELOW,
    NOISE_BITS,
    SamplingTensors,
    _top_k_top_p,
    filter_cutoffs,
    gumbel_from_bits,
    gumbel_noise,
    hash_bits,
    processed_logits,
    sample,
    sample_raw,
    sample_reference,
    sample_selected,
)
from tests.conftest import edge_rows


@pytest.fixture(autouse=True)
def _reference(monkeypatch):
    """These tests pin down the sampling semantics over up to 20000 draws, through the PyTorch reference:
    the interpreter would take minutes. tests/ops/test_gumbel_sample.py holds the kernel to it."""
    monkeypatch.setattr(ops, "TRITON_INTERPRET", False)


def _params(n, temperature=1.0, top_k=-1, top_p=1.0, seed=0, min_p=0.0):
    full = lambda v, dtype: torch.full((n,), v, dtype=dtype)
    return SamplingTensors(
        full(temperature, torch.float32),
        full(top_k, torch.int32),
        full(top_p, torch.float32),
        torch.arange(n, dtype=torch.int64) + seed,
        torch.full((n,), 5, dtype=torch.int64),
        full(min_p, torch.float32),
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


# Qwen3's vocabulary: the float32 edges below only show at this size.
VOCAB = 151_936
# (seed, position, token): rows whose hash reaches its largest value (top 24 bits all ones) at `token`,
# where the old map (bits >> 8 + 0.5) / 2**24 rounded to 1.0 and the noise was +inf. Found by a scan
# of 2112 rows at VOCAB; about 1 row in 110 has one.
EXTREME_ROWS = [
    (663376102493142038, 820, 124065),
    (3820451067676068949, 36097, 38762),
    (2079195154127602215, 37688, 104441),
    (3960201236132007025, 20330, 131012),
    (7045732717745660262, 5057, 137202),
    (3038654794535930731, 8154, 55102),
    (2030900422948465474, 3416, 45),
    (4294168435406650982, 32811, 78588),
    (8943454257142263666, 5144, 65959),
    (4483593432366002419, 16898, 54691),
    (3002560640212351671, 34518, 51971),
    (5869400710394365133, 11317, 49851),
]


def _rows(seeds, positions, temperature, top_k, top_p):
    n = len(seeds)
    return SamplingTensors(
        torch.full((n,), temperature, dtype=torch.float32),
        torch.full((n,), top_k, dtype=torch.int32),
        torch.full((n,), top_p, dtype=torch.float32),
        torch.as_tensor(seeds, dtype=torch.int64),
        torch.as_tensor(positions, dtype=torch.int64),
        torch.zeros(n),
    )


def _one_row(logits, temperature, top_k, top_p):
    """Processed logits of one [V] row."""
    return processed_logits(logits[None], _rows([0], [0], temperature, top_k, top_p))[0]


def _head_logits():
    """A [VOCAB] row: a Gaussian tail and a head of ten tokens among ids < 64."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(33))
    logits[[3, 9, 17, 24, 30, 41, 47, 52, 58, 63]] = torch.tensor([9.0, 8.8, 8.6, 8.3, 8.1, 7.9, 7.6, 7.4, 7.2, 7.0])
    return logits


def test_noise_is_finite_for_every_hash_value():
    k = torch.arange(1 << NOISE_BITS, dtype=torch.int64)  # every value the map is ever given
    noise = gumbel_from_bits(k)
    assert torch.isfinite(noise).all()
    assert (noise[1:] > noise[:-1]).all()  # strictly increasing: no two values collapse
    # Against float64 at both ends, where the old map broke, and on a stride through the middle.
    some = torch.cat([k[:4096], k[4096:-4096:61], k[-4096:]])
    u = (some.double() + 0.5) / (1 << NOISE_BITS)
    assert (noise[some].double() - (-torch.log(-torch.log(u)))).abs().max() < 2e-6
    # The map is what gumbel_noise applies to the top NOISE_BITS bits of a 32-bit hash.
    seed, pos = torch.tensor([1, 2**62 + 5]), torch.tensor([0, 9])
    bits = hash_bits(seed, pos, 1000)
    assert bits.min() >= 0 and bits.max() < 2**32
    assert torch.equal(gumbel_noise(seed, pos, 1000), gumbel_from_bits(bits >> (32 - NOISE_BITS)))


def test_sampled_tokens_stay_in_the_processed_support_at_real_vocab():
    # The rows that reached the largest hash value, and random ones: ~0.6 rows x VOCAB token draws.
    seeds, positions, extreme_tokens = map(list, zip(*EXTREME_ROWS))
    gen = torch.Generator().manual_seed(1)
    seeds += torch.randint(0, 2**62, (52,), generator=gen).tolist()
    positions += torch.randint(0, 40960, (52,), generator=gen).tolist()
    params = _rows(seeds, positions, 0.7, 20, 0.8)
    bits = hash_bits(params.seed[:12], params.position[:12], VOCAB)
    assert (bits[torch.arange(12), extreme_tokens] >> 8 == (1 << 24) - 1).all()  # the rows still test the edge
    processed = _one_row(torch.randn(VOCAB, generator=gen) * 3, 0.7, 20, 0.8)
    assert torch.isinf(processed[extreme_tokens]).all()  # ... on tokens outside the support
    tokens = sample(processed.expand(len(seeds), VOCAB), params)
    assert torch.isfinite(processed[tokens]).all()
    assert torch.isfinite(processed.log_softmax(-1)[tokens]).all()


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return torch.special.gammaincc(torch.tensor((len(counts) - 1) / 2.0), stat / 2).item()


def test_sampled_frequencies_match_the_processed_distribution_at_real_vocab():
    logits, draws = _head_logits(), 20000
    # temperature / top-p decide the support (top-k 20 is wider), then top-k does (top-p off).
    for temperature, top_k, top_p, support in ((0.7, 20, 0.8, [3, 9, 17, 24, 30]), (1.3, 5, 1.0, [3, 9, 17, 24, 30])):
        processed = _one_row(logits, temperature, top_k, top_p)
        assert torch.isfinite(processed).nonzero().flatten().tolist() == support
        torch.testing.assert_close(processed[support], logits[support] / temperature)
        params = _rows(torch.arange(draws) * 7919 + 11, [17] * draws, temperature, top_k, top_p)
        # Everything from id 64 on is -inf, so its noise cannot win: draw from the first 64 columns,
        # whose noise is the full row's (checked here on 32 rows at full width).
        tokens = sample(processed[:64].expand(draws, 64), params)
        head = _rows(params.seed[:32], params.position[:32], temperature, top_k, top_p)
        assert torch.equal(sample(processed.expand(32, VOCAB), head), tokens[:32])
        counts = torch.bincount(tokens, minlength=64).double()
        assert counts[support].sum() == draws
        probs = (logits[support].double() / temperature).softmax(0)
        assert _chi_square_p(counts[support], probs) > 1e-3


def test_ties_are_broken_by_the_noise_not_the_token_id():
    processed = _one_row(torch.zeros(VOCAB), 1.0, 4, 1.0)  # top-k among equal logits: the lowest ids
    assert torch.isfinite(processed).nonzero().flatten().tolist() == [0, 1, 2, 3]
    params = _rows(torch.arange(8000), [3] * 8000, 1.0, 4, 1.0)
    counts = torch.bincount(sample(processed[:64].expand(8000, 64), params), minlength=64).double()
    assert _chi_square_p(counts[:4], torch.full((4,), 0.25, dtype=torch.float64)) > 1e-3


def test_top_p_one_keeps_every_token_and_the_mass_is_summed_exactly():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=gen) * torch.tensor([1.0, 3.0, 4.0, 8.0])[:, None]
    off = torch.full((4,), -1, dtype=torch.int32)
    # A float32 running sum reaches 1 before the tail and masked up to ~100k tokens of these rows.
    assert torch.isfinite(_top_k_top_p(logits, off, torch.ones(4))).all()
    for top_p in (0.9, 0.999):
        kept = torch.isfinite(_top_k_top_p(logits, off, torch.full((4,), top_p))).sum(-1)
        sorted_probs = logits.double().sort(-1, descending=True).values.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        assert torch.equal(kept, (mass_before <= torch.tensor(top_p).double()).sum(-1))
    # Equal logits: exactly the ids whose mass before them is <= 0.3 (r / V <= 0.3f).
    kept = torch.isfinite(_one_row(torch.zeros(VOCAB), 1.0, -1, 0.3))
    assert kept.nonzero().flatten().tolist() == list(range(45581))


def test_temperature_below_the_greedy_threshold_is_greedy():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(2))
    logits[:, 7], logits[:, 99] = 1e33, 1e33  # tie: the lower id; 1e33 / 1e-6 overflowed float32
    params = _params(4, temperature=1e-6, top_k=3, top_p=0.5)
    params.temperature[1:] = torch.tensor([GREEDY_BELOW * 0.99, 1e-30, 0.0])
    processed = processed_logits(logits, params)
    assert torch.equal(processed, logits)  # raw, like temperature 0
    assert sample(processed, params).tolist() == [7, 7, 7, 7]


def test_extreme_logits_stay_finite_and_in_support():
    rows = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(3))
    rows[0, 5], rows[0, 6] = 1e30, -1e30
    rows[1, 8], rows[1, 9] = 3e38, 2e38  # / 0.5 overflows: the row is shifted by its max first
    rows[2] = float("-inf")
    rows[2, VOCAB - 1] = -1e30  # one finite entry, at the last id
    rows[3, 11] = -1e34  # / 1e-5 overflows to -inf: probability 0 either way
    rows[4] = 0.0
    params = _params(5, temperature=0.5, top_k=20, top_p=0.9)
    params.temperature[3], params.top_p[4] = GREEDY_BELOW, 1.0
    processed = processed_logits(rows, params)
    assert not torch.isnan(processed).any() and not (processed == float("inf")).any()
    tokens = sample(processed, params)
    assert tokens[:3].tolist() == [5, 8, VOCAB - 1]
    logprobs = processed.log_softmax(-1).gather(-1, tokens[:, None])
    assert torch.isfinite(logprobs).all()
    assert torch.isfinite(processed[4]).nonzero().flatten().tolist() == list(range(20))  # ties: lower ids


def _min_p_reference(logits: torch.Tensor, temperature: float, min_p: float) -> torch.Tensor:
    """vLLM's MinPLogitsProcessor on temperature-scaled logits, in float64: -inf where a token's probability is
    below min_p times the row's largest."""
    scaled = logits.double() / temperature
    probs = scaled.softmax(-1)
    return scaled.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))


@pytest.mark.parametrize("filtered", [False, True])
def test_min_p_keeps_what_vllm_keeps(filtered):
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(5)) * 3
    for temperature, min_p in ((1.0, 0.05), (0.5, 0.2), (2.0, 0.01), (0.7, 1.0), (1.3, 0.0)):
        params = _params(6, temperature=temperature, min_p=min_p)
        processed = processed_logits(logits, params, filtered=filtered)
        ref = _min_p_reference(logits, temperature, min_p)
        assert torch.equal(processed.isinf(), ref.isinf()), (temperature, min_p)
        kept = processed.isfinite()
        torch.testing.assert_close(processed[kept].double(), ref[kept])
        if min_p == 1.0:  # only the most likely token survives
            assert kept.sum(-1).tolist() == [1] * 6
        if min_p == 0.0:
            assert kept.all()


def test_min_p_composes_with_top_k_and_spares_greedy_rows():
    logits = torch.randn(2, 500, generator=torch.Generator().manual_seed(6)) * 4
    params = _params(2, temperature=0.8, top_k=3, min_p=0.3)
    params.temperature[1] = 0.0
    processed = processed_logits(logits, params)
    kept = processed[0].isfinite()
    both = _min_p_reference(logits[:1], 0.8, 0.3)[0].isfinite() & (logits[0] >= logits[0].topk(3).values[-1])
    assert torch.equal(kept, both) and 1 <= kept.sum() <= 3
    assert torch.equal(processed[1], logits[1])


@pytest.mark.parametrize("vocab", [3000, VOCAB])
def test_cutoff_keys_keep_what_the_sort_keeps(vocab):
    """Rows of ties (few distinct values), -inf, -0.0 beside 0.0, huge values, rows without filters, top_k from 1
    to 3000, with and without top-p, top-p alone: the tokens whose order keys reach the row's cutoff are those
    the full sort keeps."""
    gen = torch.Generator().manual_seed(3)
    rows = [
        torch.randn(vocab, generator=gen) * 4,
        torch.randint(-3, 3, (vocab,), generator=gen).float(),  # ties everywhere
        torch.randn(vocab, generator=gen).masked_fill(torch.rand(vocab, generator=gen) < 0.5, float("-inf")),
        torch.where(torch.rand(vocab, generator=gen) < 0.5, -0.0, 0.0),  # zeros of both signs: all tied
        (torch.rand(vocab, generator=gen) * 2 - 1) * 3e38,  # huge but finite (a non-finite row fails its request)
        torch.randn(vocab, generator=gen),  # no filter: passes through
    ]
    logits = torch.stack(rows)
    cases = [([1, 5, 64, 40, 2, -1], 1.0), ([7, 64, 3, 64, 33, -1], 0.7), ([64] * 5 + [-1], 0.2)]
    cases += [([-1] * 6, 0.9), ([500, -1, 3000, -1, 1, -1], 0.5)]
    for top_k, top_p in cases:
        params = _params(6)
        params.top_k.copy_(torch.tensor(top_k))
        params.top_p.copy_(torch.tensor([top_p] * 5 + [1.0]))
        filters = (params.top_k > 0) | (params.top_p < 1)
        cutoff = filter_cutoffs(logits, params, logits.amax(-1))
        kept = logits.masked_fill(order_keys_reference(logits) < cutoff[:, None], float("-inf"))
        expected = torch.where(filters[:, None], _top_k_top_p(logits, params.top_k, params.top_p), logits)
        assert torch.equal(kept, expected), (top_k, top_p)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("vocab", [20, 3000, VOCAB])  # 20: fewer tokens than the cap
def test_selection_on_the_cpu_samples_and_writes_as_the_sort(vocab):
    """sample_selected's PyTorch path (the top-k rows filtered among their k largest, the rounds for top-p alone)
    against sample_raw with filter_cutoffs' sort: the same tokens on every row, near-ties of logit + noise included
    (the same noise), and the same processed logits written bit for bit into a poisoned write_to (but on the rows
    holding a NaN, which the GPU does not filter either), the rows not flagged left as they were. Rows: plain,
    ties, -inf, zeros of both signs, huge, NaN, +inf, only -inf, min-p, greedy rows asking filters; top_k 1, 5,
    the cap, top-p alone (several rows, some taking more than one round) and neither."""
    gen = torch.Generator().manual_seed(vocab)
    rows = [
        *edge_rows(vocab, gen),
        torch.randn(vocab, generator=gen).index_fill(0, torch.tensor([vocab // 3]), float("nan")),
        torch.randn(vocab, generator=gen).index_fill(0, torch.tensor([7]), float("inf")),
        torch.full((vocab,), float("-inf")),
    ]
    logits = torch.cat([torch.stack(rows)] * 2 + [torch.randn(8, vocab, generator=gen) * 0.3])
    n = logits.shape[0]
    params = _params(n, temperature=0.8, seed=vocab)
    params.top_k.copy_(torch.tensor([1, 5, 64, 5, 64, 3, 2, 64] + [-1] * 8 + [5, -1, 64, -1, -1, 1, -1, -1]))
    params.top_p.copy_(torch.tensor([1.0, 0.7, 0.9, 0.5, 0.3] * 2 + [0.6, 0.9, 0.2, 0.999, 0.8, 0.5] + [0.8] * 8))
    params.top_p[23] = 1.0  # a row without filters
    params.min_p[[2, 10, 18, 19]] = 0.05
    params.temperature[[20, 21]] = 0.0  # greedy rows asking filters: unused
    write_rows = (params.top_k > 0).long()  # the rows asking top-p alone write nothing (their variant sorts)
    write_rows[0] = 0
    peak = logits.amax(-1)
    want_to = torch.full_like(logits, 123.25)
    got_to = want_to.clone()

    expected = sample_raw(logits, params, peak, write_rows, filter_cutoffs(logits, params, peak), want_to)
    got_peak, tokens = sample_selected(logits.clone(), params, write_rows, got_to, cap=64)

    assert torch.equal(got_peak.nan_to_num(), peak.nan_to_num()) and torch.equal(tokens, expected)
    finite = ~logits.isnan().any(-1)
    assert torch.equal(got_to[finite].view(torch.int32), want_to[finite].view(torch.int32))
    written = (write_rows != 0) & (params.temperature > 0)
    assert (got_to[~written] == 123.25).all() and not (got_to[written] == 123.25).any()
    first_draw = sample_reference(processed_logits(logits, params, peak, filtered=False), params)
    top_p_alone = (params.top_k <= 0) & (params.top_p < 1) & (params.temperature > 0)
    assert (tokens != first_draw)[top_p_alone].any()  # a row whose first candidate top-p rejected
