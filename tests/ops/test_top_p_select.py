"""ops/top_p_select.py (Triton in the interpreter on the CPU) against sampler.filter_cutoffs' sort: for rows
asking top-p alone, the cutoff keeps exactly the tokens the sort keeps; other rows are not written."""

import pytest
import torch

from qwen3_runtime.ops.top_p_select import CHUNK, top_p_cutoffs
from qwen3_runtime.sampler import GREEDY_BELOW, SamplingTensors, filter_cutoffs, order_keys_reference, processed_logits

POISON = 12345


def _rows(vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Random rows at several spreads (the kept prefix from one token to most of the row); ties (few distinct
    values); half -inf; zeros of both signs; huge but finite; min-p's floor; a greedy row; top-k beside top-p."""
    rows = [
        torch.randn(vocab, generator=gen) * 3,
        torch.randn(vocab, generator=gen) * 0.01,
        torch.randn(vocab, generator=gen) * 20,
        torch.randint(-3, 3, (vocab,), generator=gen).float(),
        torch.randn(vocab, generator=gen).masked_fill(torch.rand(vocab, generator=gen) < 0.5, float("-inf")),
        torch.where(torch.rand(vocab, generator=gen) < 0.5, -0.0, 0.0),
        (torch.rand(vocab, generator=gen) * 2 - 1) * 3e38,
        torch.randn(vocab, generator=gen) * 2,
        torch.randn(vocab, generator=gen),
        torch.randn(vocab, generator=gen),
    ]
    return torch.stack(rows)


def _check(vocab: int, top_p: float, device: str) -> None:
    gen = torch.Generator().manual_seed(vocab + int(top_p * 100))
    logits = _rows(vocab, gen).to(device)
    n = logits.shape[0]
    params = SamplingTensors(
        torch.tensor([0.7, 1.0, 0.5, 1.3, 0.9, 0.8, 1e-3, 1.1, 0.0, 0.9]),
        torch.tensor([-1] * 8 + [-1, 20], dtype=torch.int32),  # row 8 greedy, row 9 top-k: not this kernel's
        torch.full((n,), top_p),
        torch.arange(n, dtype=torch.int64),
        torch.full((n,), 3, dtype=torch.int64),
        torch.tensor([0.0] * 7 + [0.05, 0.0, 0.0]),
    )
    params = SamplingTensors(*(t.to(device) for t in vars(params).values()))
    peak = logits.amax(-1)
    cutoff = torch.full((n,), POISON, dtype=torch.int64, device=device)
    top_p_cutoffs(logits, params.temperature, params.top_k, params.top_p, params.min_p, peak, GREEDY_BELOW, cutoff)
    values = processed_logits(logits, params, peak, filtered=False)
    keys = order_keys_reference(values)
    ours = (keys >= cutoff[:, None]) & values.isfinite()
    sort = (keys >= filter_cutoffs(logits, params, peak)[:, None]) & values.isfinite()
    assert torch.equal(ours[:8], sort[:8]), (ours[:8].sum(-1), sort[:8].sum(-1))
    assert (cutoff[8:] == POISON).all()


@pytest.mark.parametrize("top_p", [0.05, 0.91])  # not a multiple of a tied row's token share
def test_cutoffs_keep_what_the_sort_keeps(top_p):
    _check(CHUNK + 77, top_p, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("top_p", [0.05, 0.43, 0.91])
def test_cutoffs_keep_what_the_sort_keeps_on_gpu_at_qwen3_vocab(top_p):
    _check(151_936, top_p, "cuda")
