"""kept_prefix (Triton in the interpreter on the CPU) against filter_sorted's finite count, the sort-based
reference: rows of ties, -inf, huge values, a row of -inf only; top_k off, small, past the width; top_p off, tiny,
near 1; widths inside one chunk, across two chunks and across five, whose masses the second kernel pads to eight
(as Qwen3's vocabulary's 75 to 128, on the GPU)."""

import pytest
import torch

from qwen3_runtime.ops import kept_prefix as kp
from qwen3_runtime.ops.kept_prefix import filter_sorted, kept_prefix

VOCAB = 151936


def _rows(width: int, generator: torch.Generator) -> torch.Tensor:
    rows = [
        torch.randn(width, generator=generator) * 3,
        torch.randn(width, generator=generator) * 0.01,  # nearly flat: top-p keeps most of the row
        torch.randint(-3, 3, (width,), generator=generator).float(),  # ties everywhere
        torch.randn(width, generator=generator).masked_fill(torch.rand(width, generator=generator) < 0.5, -torch.inf),
        (torch.rand(width, generator=generator) * 2 - 1) * 3e38,  # huge but finite
        torch.full((width,), -torch.inf),
    ]
    return torch.stack(rows).sort(dim=-1, descending=True, stable=True).values


@pytest.mark.parametrize("width", [64, kp.CHUNK + 77, 4 * kp.CHUNK + 77])
def test_matches_the_finite_count_of_filter_sorted(width):
    generator = torch.Generator().manual_seed(width)
    values = _rows(width, generator)
    cases = [
        ([-1] * 6, [1.0] * 6),
        ([-1] * 6, [0.9, 0.5, 0.3, 0.95, 0.7, 0.8]),
        ([1, 5, 20, width, width + 9, 3], [1.0, 0.8, 0.2, 0.999, 0.6, 0.5]),
        ([0, 64, -1, 7, 2, 64], [1e-6, 0.9999999, 0.8, 1.0, 0.4, 0.9]),
    ]
    for top_k, top_p in cases:
        top_k, top_p = torch.tensor(top_k, dtype=torch.int32), torch.tensor(top_p)
        expected = (filter_sorted(values, top_k, top_p) != -torch.inf).sum(dim=-1)
        assert kept_prefix(values, top_k, top_p).tolist() == expected.tolist(), (top_k, top_p)


def test_no_rows():
    assert kept_prefix(torch.empty(0, 10), torch.empty(0, dtype=torch.int32), torch.empty(0)).shape == (0,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_matches_the_reference_on_gpu_at_qwen3_vocab():
    generator = torch.Generator().manual_seed(1)
    values = _rows(VOCAB, generator).cuda()
    top_k = torch.tensor([-1, 20, -1, 50, -1, -1], dtype=torch.int32, device="cuda")
    top_p = torch.tensor([0.9, 0.8, 0.5, 1.0, 0.7, 0.8], device="cuda")
    expected = (filter_sorted(values, top_k, top_p) != -torch.inf).sum(dim=-1)
    assert kept_prefix(values, top_k, top_p).tolist() == expected.tolist()


@pytest.mark.parametrize("width", [1, 2, kp.CHUNK - 1, kp.CHUNK])  # one entry; a chunk just short of and exactly full
def test_matches_the_finite_count_at_chunk_edges_with_poisoned_scratch(monkeypatch, width):
    """The chunk masses start as NaN: a chunk left unsummed, or a padded one read, shows in every count."""
    empty = torch.empty
    monkeypatch.setattr(kp.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    values = _rows(width, torch.Generator().manual_seed(width + 5))
    top_k = torch.tensor([-1, 1, 2, width, 0, 5], dtype=torch.int32)
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.999, 1e-6, 0.7])
    expected = (filter_sorted(values, top_k, top_p) != -torch.inf).sum(dim=-1)
    assert kept_prefix(values, top_k, top_p).tolist() == expected.tolist()
