import numpy as np
import pytest
import torch

from qwen3_runtime.logprobs.reduce import LogprobBuffers
from qwen3_runtime.packed_rows import PackedLogprobs, StepLogprobs, build_latest, packed_width, unpack_rows
from qwen3_runtime.packing import pack, pack_reference


def _packed_pair():
    k = 3
    buffers = LogprobBuffers.allocate(2, k, 100, "cpu")
    buffers.logprob.copy_(torch.tensor([-0.5, -1.25]))
    buffers.rank.copy_(torch.tensor([1, 7], dtype=torch.int32))
    buffers.logsumexp.copy_(torch.tensor([3.0, 4.5]))
    buffers.top_ids.copy_(torch.tensor([[4, 2, 9], [1, 0, -1]], dtype=torch.int32))
    buffers.top_logprobs.copy_(torch.tensor([[-0.5, -1.0, -2.0], [-0.25, -3.0, float("-inf")]]))
    out = torch.full((2, packed_width(k)), -7, dtype=torch.int32)
    buffers.status.copy_(torch.tensor([0, 1], dtype=torch.int8))
    pack(torch.tensor([4, 11]), buffers, out)
    return out.numpy()


def test_pack_round_trip():
    host = _packed_pair()
    assert packed_width(3) == 11 and host[:, :2].tolist() == [[4, 0], [11, 1]]
    first, second = unpack_rows(host[:1], 2)[0], unpack_rows(host[1:], 3)[0]
    assert (first.token_id, first.logprob, first.rank, first.logsumexp) == (4, -0.5, 1, 3.0)
    assert first.top_ids == [4, 2] and first.top_logprobs == [-0.5, -1.0]
    assert second.top_ids == [1, 0, -1] and np.isneginf(second.top_logprobs[2])


# Each row's largest logit: finite ones, and NaN, +inf and -inf (every logit -inf), which get status 1.
PEAKS = [1.5, float("nan"), float("inf"), -3.0, float("-inf"), 1e30, -1e30]


def _random_buffers(rows: int, k: int, device: str = "cpu") -> LogprobBuffers:
    buffers = LogprobBuffers.allocate(rows, k, 1000, device)
    buffers.logprob.copy_(-torch.rand(rows) * 9)
    buffers.rank.copy_(torch.randint(1, 1000, (rows,), dtype=torch.int32))
    buffers.logsumexp.copy_(torch.randn(rows) * 30)
    buffers.top_ids.copy_(torch.randint(-1, 1000, (rows, k), dtype=torch.int32))
    buffers.top_logprobs.copy_(-torch.rand(rows, k) * 9)
    buffers.top_logprobs[:, -1:] = float("-inf")
    buffers.status.copy_(torch.tensor([0, 1, 2, 0, 1, 0, 2][:rows], dtype=torch.int8))
    return buffers


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_pack_kernel_matches_its_reference(k):
    """The Triton kernel (the interpreter on the CPU) against the PyTorch copies, every column of a
    poisoned output, with the status from the reduction and from each row's largest logit."""
    buffers = _random_buffers(7, k)
    tokens = torch.randint(0, 151936, (7,))
    peak = torch.tensor(PEAKS)
    for source in ({}, {"peak": peak}):
        out, expected = (torch.full((7, packed_width(k)), -7, dtype=torch.int32) for _ in range(2))
        pack(tokens, buffers, out, **source)
        pack_reference(tokens, buffers, expected, **source)
        assert torch.equal(out, expected)
    assert out[:, 1].tolist() == [0, 1, 1, 0, 1, 0, 0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pack_kernel_matches_its_reference_on_the_gpu():
    buffers = _random_buffers(7, 20, "cuda")
    tokens = torch.randint(0, 151936, (7,), device="cuda")
    peak = torch.tensor(PEAKS, device="cuda")
    out, expected = (torch.full((7, packed_width(20)), -7, dtype=torch.int32, device="cuda") for _ in range(2))
    pack(tokens, buffers, out, peak=peak)
    pack_reference(tokens, buffers, expected, peak=peak)
    assert torch.equal(out, expected)


def test_packed_logprobs_build_entries_on_read():
    host = _packed_pair()
    entries = PackedLogprobs(host, 2, leading=1)
    assert len(entries) == 3 and entries[0] is None
    assert entries[1] == unpack_rows(host[:1], 2)[0] == entries[-2]
    assert entries[2] is None  # status 1: a failed row
    assert entries.count(None) == 2 and entries[1:] == [entries[1], None] and list(entries)[0] is None
    with pytest.raises(IndexError):
        entries[3]


def test_step_logprobs_keep_packed_rows_until_read():
    host = _packed_pair()
    (reference,) = unpack_rows(host[:1], 2)
    entries = StepLogprobs(2)
    entries.append(host[0].copy())  # device path: the step's packed row
    entries.append(reference)  # host path: already a TokenLogprob
    assert len(entries) == 2 and isinstance(entries.entries[0], np.ndarray)
    assert entries[0] == reference == entries[-1] and entries[:] == [reference, reference]


def test_build_latest_builds_each_last_packed_row_in_place():
    host = _packed_pair()
    one, two, three = StepLogprobs(1), StepLogprobs(2), StepLogprobs(2)
    for entries, row in ((one, host[1]), (two, host[0]), (three, host[1])):
        entries.append(host[0].copy())  # an earlier step's row stays packed
        entries.append(row.copy())
    built_already, empty = StepLogprobs(2), StepLogprobs(2)
    built_already.append(unpack_rows(host[:1], 2)[0])
    build_latest([one, two, three, built_already, empty])
    assert one.entries[-1] == unpack_rows(host[1:], 1)[0] and two.entries[-1] == unpack_rows(host[:1], 2)[0]
    assert three.entries[-1] == unpack_rows(host[1:], 2)[0] and built_already[0] == unpack_rows(host[:1], 2)[0]
    assert all(isinstance(e.entries[0], np.ndarray) for e in (one, two, three)) and len(empty) == 0
