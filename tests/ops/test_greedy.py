"""The greedy row maximum and token against `logits.max(dim=-1)` (Triton in the interpreter on the CPU)."""

import pytest
import torch

from qwen3_runtime.ops import greedy
from qwen3_runtime.ops.greedy import CHUNK, greedy_max, greedy_max_reference


def _logits(rows: int, vocab: int, device: str = "cpu") -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    x[0, [7, CHUNK + 3, vocab - 1]] = 1e30  # a tie across chunks: the lowest id wins
    x[1, :] = float("-inf")
    x[1, vocab // 2] = -3e38  # the only finite logit
    x[2, [vocab - 2, vocab - 1]] = 50.0  # the maximum in the last, partial chunk
    x[3, 5] = float("inf")
    x[4, :] = 0.0
    x[4, 9] = -0.0  # -0.0 ties +0.0
    x[5, :] = float("-inf")  # every logit -inf: peak -inf, token 0
    return x.to(device)


def _check(logits: torch.Tensor) -> None:
    nan_rows = logits.isnan().any(1)
    peak, token = greedy_max(logits)
    ref_peak, ref_token = greedy_max_reference(logits)
    assert peak.dtype == torch.float32 and token.dtype == torch.int64
    assert torch.equal(peak.isnan(), nan_rows)
    assert torch.equal(peak[~nan_rows], ref_peak[~nan_rows])
    assert torch.equal(token[~nan_rows], ref_token[~nan_rows])


@pytest.mark.parametrize("vocab", [1, 100, CHUNK, CHUNK + 1, 2 * CHUNK + 1808])
def test_matches_torch_max(vocab):
    rows = 6 if vocab > 2 * CHUNK else 2
    logits = _logits(rows, vocab) if vocab > 2 * CHUNK else torch.randn(rows, vocab)
    _check(logits)


def test_a_nan_anywhere_makes_the_peak_nan():
    logits = _logits(6, 2 * CHUNK + 1808)
    logits[5, CHUNK + 11] = float("nan")
    logits[0, 3] = float("nan")  # beside the row's tied maxima
    _check(logits)


def test_ties_go_to_the_lowest_id():
    logits = torch.zeros(3, 3 * CHUNK)
    logits[0, [CHUNK + 1, 2 * CHUNK + 5]] = 1.0
    logits[1, [2 * CHUNK + 5, CHUNK + 1]] = 1.0
    peak, token = greedy_max(logits)
    assert token.tolist() == [CHUNK + 1, CHUNK + 1, 0] and peak.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 33])
def test_matches_torch_max_on_gpu_at_qwen3_vocab(rows):
    logits = torch.randn(rows, 151936, device="cuda") * 5
    logits[0, [17, 100000]] = 40.0
    if rows > 1:
        logits[1, 4242] = float("nan")
    _check(logits)
    _check(_logits(6, 151936, "cuda"))


@pytest.mark.parametrize("rows, vocab", [(1, 1), (1, CHUNK - 1), (3, 2 * CHUNK + 1)])
def test_every_output_is_written(monkeypatch, rows, vocab):
    """Scratch and outputs start as poison (NaN for values, -7 for ids): one row, one token, a partial last chunk;
    huge finite values of both signs and a row entirely -inf (masked) among them."""
    empty = torch.empty

    def poisoned(*shape, dtype=None, **kw):
        out = empty(*shape, dtype=dtype, **kw)
        return out.fill_(float("nan") if out.is_floating_point() else -7)

    monkeypatch.setattr(greedy.torch, "empty", poisoned)
    logits = (torch.rand(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 2 - 1) * 3e38
    if rows > 1:
        logits[1] = float("-inf")
        logits[2, [vocab - 1, 0]] = 3.4e38  # a tie between the first and the last, partial, chunk
    _check(logits)
    assert greedy_max(logits)[1][-1].item() == (0 if rows > 1 else logits[0].argmax().item())
    peak, token = greedy_max(logits[:0])
    assert peak.shape == token.shape == (0,)
