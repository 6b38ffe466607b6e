"""ops/top_k_sample.py (Triton in the interpreter on the CPU) against the sort-based reference: each row's
peak, its token where the candidates sample it (the same as sampling the sorted, filtered processed logits but
for near-ties of logit + noise), the cutoff keeping exactly the tokens the sort keeps, and which rows are left
to the full pass."""

import pytest
import torch

from qwen3_runtime.ops import top_k_sample
from qwen3_runtime.ops.top_k_sample import BLOCK, top_k_candidates
from qwen3_runtime.order_keys import order_keys_reference
from qwen3_runtime.sampler import (
    GREEDY_BELOW,
    NOISE_BITS,
    SamplingTensors,
    gumbel_noise,
    processed_logits,
    sample_reference,
)
from tests.conftest import edge_rows

VOCAB = 151_936
NEAR_TIE = 1e-5
CAP = 64


def _rows(vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Random rows; ties everywhere; half -inf; zeros of both signs; huge but finite; a NaN; one block holding
    the whole top; a top spread one per block; plain random rows for the greedy and unfiltered cases; +inf."""
    rows = [
        *edge_rows(vocab, gen),
        torch.randn(vocab, generator=gen).index_fill(0, torch.tensor([vocab // 3, vocab - 1]), float("nan")),
        torch.randn(vocab, generator=gen).index_fill(0, torch.arange(BLOCK, 2 * BLOCK), 9.0),
        torch.randn(vocab, generator=gen).index_fill(0, torch.arange(0, vocab, BLOCK), 9.0),
        torch.randn(vocab, generator=gen) * 2,
        torch.randn(vocab, generator=gen) * 2,
        torch.randn(vocab, generator=gen).index_fill(0, torch.tensor([7, 700]), float("inf")),
    ]
    return torch.stack(rows)


def _check(vocab: int, device: str) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = _rows(vocab, gen)
    n = logits.shape[0]
    temperature = torch.tensor([0.7, 1.0, 0.5, 1.3, 1e-3, 0.9, 0.8, 1.1, 0.0, 0.6, 0.7])  # row 8 greedy
    top_k = torch.tensor([20, 64, 1, 5, 33, 10, 64, 40, 7, -1, 5])  # row 9: no top-k (left to the full pass)
    top_p = torch.tensor([0.8, 1.0, 0.5, 0.9, 0.3, 1.0, 0.95, 0.6, 0.8, 0.9, 0.9])  # row 9: top-p alone
    min_p = torch.tensor([0.0, 0.05, 0.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0])
    write = torch.tensor([0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0])
    seed = torch.arange(n, dtype=torch.int64) * 7919 + vocab
    params = SamplingTensors(temperature, top_k.int(), top_p, seed, torch.full((n,), 9, dtype=torch.int64), min_p)
    params = SamplingTensors(*(t.to(device) for t in vars(params).values()))
    logits, write = logits.to(device), write.to(device)
    poison = logits.clone()

    peak, token, cutoff, done, top_p_rows = top_k_candidates(
        logits, params.temperature, params.top_k, params.top_p, params.min_p, params.seed, params.position,
        write, GREEDY_BELOW, NOISE_BITS, CAP,
    )  # fmt: skip
    assert top_p_rows.tolist() == [int(row == 9) for row in range(n)]  # left to ops/top_p_sample.py
    torch.testing.assert_close(logits, poison, rtol=0, atol=0, equal_nan=True)  # read only
    assert torch.equal(peak.isnan(), logits.isnan().any(-1))
    assert torch.equal(peak.nan_to_num(), logits.amax(-1).nan_to_num())
    greedy = temperature.to(device) < GREEDY_BELOW
    assert done.tolist() == (greedy | ((params.top_k > 0) & (write == 0))).tolist()
    assert ((token >= 0) & (token < vocab)).all()

    processed = processed_logits(logits, params, logits.amax(-1))
    expected = sample_reference(processed, params)
    noise = gumbel_noise(params.seed, params.position, vocab).masked_fill_(greedy[:, None], 0.0)
    top2 = (processed + noise).topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1] > NEAR_TIE) | greedy
    nan_row = logits.isnan().any(-1)
    first_nan = logits.isnan().int().argmax(-1)
    assert torch.equal(token[nan_row], first_nan[nan_row])
    check = done & clear & ~nan_row
    assert check.sum() >= 5 and torch.equal(token[check], expected[check])

    unfiltered = processed_logits(logits, params, logits.amax(-1), filtered=False)
    kept = unfiltered.masked_fill(order_keys_reference(unfiltered) < cutoff[:, None], float("-inf"))
    finite = ~greedy & ~nan_row & ~logits.isposinf().any(-1)  # (+inf and NaN rows fail by their status)
    finite[9] = False  # top-p alone: its cutoff keeps everything, the rounds apply top-p
    # The cutoff may differ from the sort's where it lands among -inf tokens, which no draw picks.
    assert torch.equal(kept[finite].isfinite(), processed[finite].isfinite())
    assert cutoff[9] == -(2**63)


def test_candidates_sample_as_the_sort_at_small_vocabularies():
    _check(3 * 4096 + 77, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_candidates_sample_as_the_sort_on_gpu_at_qwen3_vocab():
    _check(VOCAB, "cuda")


@pytest.mark.parametrize("vocab", [50, 300])  # fewer tokens than the cap; fewer blocks than top-k
def test_candidates_at_vocabularies_smaller_than_the_cap(vocab):
    gen = torch.Generator().manual_seed(vocab)
    n = 6
    logits = torch.randn(n, vocab, generator=gen) * 2
    logits[1] = torch.randint(-1, 1, (vocab,), generator=gen).float()  # ties
    temperature = torch.tensor([0.7, 1.0, 0.0, 1.5, 0.9, 0.3])
    top_k = torch.tensor([64, 64, 3, 40, 1, 8], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 1.0, 0.99])
    params = SamplingTensors(temperature, top_k, top_p, torch.arange(n) * 31 + 1, torch.full((n,), 3), torch.zeros(n))
    write = torch.zeros(n, dtype=torch.int32)
    peak, token, cutoff, done, top_p_rows = top_k_candidates(
        logits, params.temperature, params.top_k, params.top_p, params.min_p, params.seed, params.position,
        write, GREEDY_BELOW, NOISE_BITS, CAP,
    )  # fmt: skip
    assert not top_p_rows.any()
    processed = processed_logits(logits, params, logits.amax(-1))
    assert done.all() and torch.equal(peak, logits.amax(-1))
    greedy = temperature < GREEDY_BELOW
    noise = gumbel_noise(params.seed, params.position, vocab).masked_fill_(greedy[:, None], 0.0)
    top2 = (processed + noise).topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1] > NEAR_TIE) | greedy
    assert torch.equal(token[clear], sample_reference(processed, params)[clear])
    unfiltered = processed_logits(logits, params, logits.amax(-1), filtered=False)
    kept = unfiltered.masked_fill(order_keys_reference(unfiltered) < cutoff[:, None], float("-inf"))
    assert torch.equal(kept[~greedy].isfinite(), processed[~greedy].isfinite())


@pytest.mark.parametrize("vocab", [BLOCK - 1, 2 * BLOCK + 1])
def test_rows_of_few_or_no_finite_logits_and_every_output_written(monkeypatch, vocab):
    """Masked rows (logit_bias -100, min_tokens): a row entirely -inf gets token 0 (as torch.argmax), a -inf peak
    and the keep-everything cutoff; rows with fewer finite logits than top_k sample only among those. Every
    output and scratch buffer starts as poison, so an element left unwritten shows."""
    empty = torch.empty

    def poisoned(*shape, dtype=None, **kw):
        out = empty(*shape, dtype=dtype, **kw)
        return out.fill_(float("nan") if out.is_floating_point() else -7)

    monkeypatch.setattr(top_k_sample.torch, "empty", poisoned)
    gen = torch.Generator().manual_seed(vocab)
    n = 5
    logits = torch.full((n, vocab), float("-inf"))
    allowed = [[], [vocab - 1], [0, BLOCK - 2, vocab - 1], [3, 4], []]
    for row, ids in enumerate(allowed):
        logits[row, ids] = torch.randn(len(ids), generator=gen)
    temperature = torch.tensor([0.8, 1.0, 0.7, 0.0, 0.0])  # rows 3 and 4 greedy
    top_k = torch.tensor([5, 64, 10, 3, 2], dtype=torch.int32)
    top_p = torch.tensor([0.9, 1.0, 0.5, 1.0, 1.0])
    params = SamplingTensors(
        temperature, top_k, top_p, torch.arange(n) * 13 + vocab, torch.full((n,), 2), torch.zeros(n)
    )
    write = torch.zeros(n, dtype=torch.int32)
    peak, token, cutoff, done, top_p_rows = top_k_candidates(
        logits, params.temperature, params.top_k, params.top_p, params.min_p, params.seed, params.position,
        write, GREEDY_BELOW, NOISE_BITS, CAP,
    )  # fmt: skip
    assert torch.equal(peak, logits.amax(-1)) and done.all() and not top_p_rows.any()
    assert token[0] == 0 and token[4] == 0 and cutoff[0] == -(2**63)
    assert all(token[row].item() in ids for row, ids in enumerate(allowed) if ids)
    processed = processed_logits(logits, params, logits.amax(-1))
    assert torch.equal(token[1:4], sample_reference(processed, params)[1:4])
    unfiltered = processed_logits(logits, params, logits.amax(-1), filtered=False)
    kept = unfiltered.masked_fill(order_keys_reference(unfiltered) < cutoff[:, None], float("-inf"))
    assert torch.equal(kept[1:3].isfinite(), processed[1:3].isfinite())
