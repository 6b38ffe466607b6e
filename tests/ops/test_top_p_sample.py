"""ops/top_p_sample.py (Triton in the interpreter on the CPU) against the sort-based reference: starting from the
noisy argmax over all tokens, the rounds end on the token sampling the sorted, top-p-filtered processed logits
gives (but for near-ties of logit + noise), in float32 sums and in float64 ones; rows not flagged keep their
token."""

import pytest
import torch

from qwen3_runtime.ops import top_p_sample
from qwen3_runtime.ops.top_p_sample import top_p_reject, top_p_reject_reference
from qwen3_runtime.sampler import (
    SamplingTensors,
    gumbel_noise,
    processed_logits,
    sample_reference,
)
from tests.conftest import edge_rows

VOCAB = 151_936
NEAR_TIE = 1e-5
POISON = -7


def _rows(vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Flat and peaked random rows; ties everywhere; half -inf; zeros of both signs; huge but finite; a NaN
    row and a +inf row (not flagged: their status fails them); plain rows for min-p, tiny and near-1 top-p."""
    rows = [
        torch.randn(vocab, generator=gen) * 0.3,
        *edge_rows(vocab, gen),
        torch.randn(vocab, generator=gen).index_fill(0, torch.tensor([vocab // 3]), float("nan")),
        torch.randn(vocab, generator=gen).index_fill(0, torch.tensor([7]), float("inf")),
        torch.randn(vocab, generator=gen),
        torch.randn(vocab, generator=gen) * 2,
        torch.randn(vocab, generator=gen) * 0.5,
        torch.randn(vocab, generator=gen) * 0.1,
    ]
    return torch.stack(rows)


def _sample(
    logits: torch.Tensor,
    params: SamplingTensors,
    pending: torch.Tensor,
    margin: float | None = None,
    reference: bool = False,
):
    """(the rounds' tokens, the reference's, the reference's top-2 gap of logit + noise, the starting tokens); the
    rounds of top_p_reject_reference if `reference`."""
    peak = logits.amax(-1)
    unfiltered = processed_logits(logits, params, peak, filtered=False)
    noise = gumbel_noise(params.seed, params.position, logits.shape[-1])
    noisy = unfiltered + noise
    start = sample_reference(unfiltered, params)
    token = torch.where(pending != 0, start, POISON)
    kwargs = {} if margin is None else {"margin": margin}
    if reference:
        top_p_reject_reference(unfiltered, noisy, pending, params.top_p, token)
    else:
        top_p_reject(logits, noisy, pending, params.temperature, peak, params.min_p, params.top_p, token, **kwargs)
    processed = processed_logits(logits, params, peak)
    top2 = (processed + noise).topk(2, dim=-1).values
    return token, sample_reference(processed, params), top2[:, 0] - top2[:, 1], start


def _check(
    vocab: int, device: str, margin: float | None = None, copies: int = 1, reference: bool = False
) -> torch.Tensor:
    """Every flagged row of _rows (each `copies` times, with other seeds) against the reference; returns how many
    rows changed token in the rounds. `reference`: the PyTorch rounds, which must give the sort's token on every
    row, near-ties of logit + noise included (the same noise)."""
    gen = torch.Generator().manual_seed(vocab)
    logits = _rows(vocab, gen).repeat(copies, 1)
    n = logits.shape[0]
    temperature = torch.tensor([1.0, 0.7, 1.0, 0.5, 1.3, 1e-3, 0.9, 0.8, 1.0, 0.6, 1.1, 1.0]).repeat(copies)
    top_p = torch.tensor([0.8, 0.9, 0.5, 0.95, 0.7, 0.3, 0.8, 0.8, 1e-6, 0.999, 0.9, 0.6]).repeat(copies)
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0]).repeat(copies)
    seed = torch.arange(n, dtype=torch.int64) * 7919 + vocab
    params = SamplingTensors(temperature, torch.full((n,), -1, dtype=torch.int32), top_p, seed,
                             torch.full((n,), 9, dtype=torch.int64), min_p)  # fmt: skip
    pending = (~(logits.isnan() | logits.isposinf()).any(-1)).to(torch.int8)
    params = SamplingTensors(*(t.to(device) for t in vars(params).values()))
    logits, pending = logits.to(device), pending.to(device)
    before = logits.clone()

    token, expected, gap, start = _sample(logits, params, pending, margin, reference)
    assert torch.equal(logits.nan_to_num(), before.nan_to_num())  # read only
    flagged = pending != 0
    assert (token[~flagged] == POISON).all()
    if reference:
        gap = torch.full_like(gap, float("inf"))
    clear = flagged & (gap > NEAR_TIE)
    assert clear.sum() >= flagged.sum() - 1 and torch.equal(token[clear], expected[clear])
    return (token != start)[flagged].sum()


@pytest.mark.parametrize("spread_rounds", [1, 2])  # rows past the spread rounds finish in one program each
def test_rounds_sample_as_the_sort(monkeypatch, spread_rounds):
    monkeypatch.setattr(top_p_sample, "BLOCK", 1024)  # several blocks a pass, the last one partial
    monkeypatch.setattr(top_p_sample, "CHUNK", 512)  # a spread round over nine chunks, the last one partial
    monkeypatch.setattr(top_p_sample, "SPREAD_ROUNDS", spread_rounds)
    assert _check(4 * 1024 + 77, "cpu", copies=2) > 0  # some rows took more than one round


@pytest.mark.parametrize(("vocab", "copies"), [(300, 32), (VOCAB, 2)])  # many seeds over the rows of ties
def test_reference_rounds_sample_as_the_sort(vocab, copies):
    assert _check(vocab, "cpu", copies=copies, reference=True) > 0


def test_rounds_in_float64_sample_as_the_sort():
    _check(300, "cpu", margin=float("inf"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rounds_sample_as_the_sort_on_gpu_at_qwen3_vocab():
    assert _check(VOCAB, "cuda", copies=8) > 0


def test_a_candidate_on_the_boundary_is_kept_as_the_sort_keeps_it():
    """Five equal logits and top_p 0.6: the mass before the fourth is 3/5, within MARGIN of float32's 0.6
    (0.6000000238...), so the float64 sums decide, keeping it as the sort's running sum (0.6000000000000001)
    does; with no margin the float32 sums decide, exact here. The first draws reach the fourth and fifth."""
    rows = 64
    logits = torch.zeros(rows, 5)
    params = SamplingTensors(torch.ones(rows), torch.full((rows,), -1, dtype=torch.int32), torch.full((rows,), 0.6),
                             torch.arange(rows), torch.zeros(rows, dtype=torch.int64), torch.zeros(rows))  # fmt: skip
    for margin in (None, 0.0):
        token, expected, gap, start = _sample(logits, params, torch.ones(rows, dtype=torch.int8), margin)
        clear = gap > NEAR_TIE
        assert (start[clear] == 3).any() and (start[clear] == 4).any()
        assert expected.max() == 3 and torch.equal(token[clear], expected[clear])


def test_reference_keeps_a_candidate_whose_mass_before_is_exactly_top_p():
    """Four equal logits and top_p 0.5: the mass before the third is exactly 0.5, which top-p keeps (<=)."""
    rows = 64
    params = SamplingTensors(torch.ones(rows), torch.full((rows,), -1, dtype=torch.int32), torch.full((rows,), 0.5),
                             torch.arange(rows), torch.zeros(rows, dtype=torch.int64), torch.zeros(rows))  # fmt: skip
    token, expected, _, start = _sample(
        torch.zeros(rows, 4), params, torch.ones(rows, dtype=torch.int8), reference=True
    )
    assert (start == 2).any() and (start == 3).any()
    assert expected.max() == 2 and torch.equal(token, expected)
