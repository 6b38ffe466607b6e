"""`reduce_logprobs` (Triton; in the interpreter on CPUs) against the float64 host reference.

CPU tests keep V small and chunks tiny so that rows still span several chunks,
groups and blocks; the `gpu` tests run V = 151936 on a CUDA device.
"""

import numpy as np
import pytest
import torch

from qwen3_runtime.logprobs import token_logprob_from_row
from qwen3_runtime.logprobs.reduce import LogprobBuffers, ReduceConfig, reduce_logprobs, reduce_logprobs_reference

TINY = ReduceConfig(chunk=32, block=4, group=4, candidates=32)
ROUNDS = ReduceConfig(chunk=32, block=4, group=4, candidates=2)  # forces the exact fallback
QWEN_VOCAB = 151936
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def realistic_logits(n_rows: int, vocab: int, seed: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """randn * 3 with a few large spikes, like real next-token logits."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, vocab, generator=gen) * 3
    spikes = torch.randint(0, vocab, (n_rows, 4), generator=gen)
    x.scatter_add_(1, spikes, 8 + 6 * torch.rand(n_rows, 4, generator=gen))
    return x.to(dtype).to(device)


def run(logits, token_ids, num_top, k_max, config=TINY, row_mask=None, out=None) -> LogprobBuffers:
    n_rows, vocab = logits.shape
    if out is None:
        out = LogprobBuffers.allocate(n_rows, k_max, vocab, logits.device, config)
    to = dict(device=logits.device)
    return reduce_logprobs(
        logits, torch.as_tensor(token_ids, **to), torch.as_tensor(num_top, **to), k_max, row_mask=row_mask, out=out
    )


def expected_status(row: torch.Tensor, token_id: int) -> int:
    try:
        token_logprob_from_row(row, token_id, 0)
    except ValueError as err:
        return 2 if "token_id" in str(err) else 1
    return 0


def assert_row_matches(logits: torch.Tensor, out: LogprobBuffers, i: int, token_id: int, num_top: int) -> None:
    """Row i of `out` against the host reference, to 2e-6 * (1 + max|x|); ranks and ids exactly."""
    row = logits[i].cpu()
    k_max, vocab = out.k_max, row.numel()
    k = min(num_top, k_max, vocab)
    status = expected_status(row, token_id)
    assert out.status[i].item() == status, f"row {i}"
    got_ids = out.top_ids[i].cpu()
    got_lp = out.top_logprobs[i].cpu().double().numpy()
    assert (got_ids[k:] == -1).all() and np.isneginf(got_lp[k:]).all()
    if status == 1:
        assert np.isnan(out.logprob[i].item()) and np.isnan(out.logsumexp[i].item())
        assert out.rank[i].item() == -1 and (got_ids == -1).all() and np.isnan(got_lp[:k]).all()
        return
    want = token_logprob_from_row(row, token_id if status == 0 else 0, k)
    finite = row.double()[torch.isfinite(row.double())]
    tol = 2e-6 * (1 + finite.abs().max().item())
    assert abs(out.logsumexp[i].item() - want.logsumexp) <= tol
    assert got_ids[:k].tolist() == want.top_ids, f"row {i}"
    want_lp = np.array(want.top_logprobs)
    assert (np.isneginf(got_lp[:k]) == np.isneginf(want_lp)).all()
    finite_lp = ~np.isneginf(want_lp)
    assert np.abs(got_lp[:k][finite_lp] - want_lp[finite_lp]).max(initial=0) <= tol
    if status == 2:
        assert np.isnan(out.logprob[i].item()) and out.rank[i].item() == -1
        return
    assert out.rank[i].item() == want.rank, f"row {i}"
    got = out.logprob[i].item()
    assert got == want.logprob if np.isneginf(want.logprob) else abs(got - want.logprob) <= tol


def check_all(logits, token_ids, num_top, k_max, config=TINY) -> LogprobBuffers:
    out = run(logits, token_ids, num_top, k_max, config)
    for i in range(logits.shape[0]):
        assert_row_matches(logits, out, i, int(token_ids[i]), int(num_top[i]))
    return out


def hard_rows(vocab: int, seed: int) -> torch.Tensor:
    """Rows that break naive top-k: ties, -inf regions, sorted values, huge offsets, signed zeros."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.arange(vocab, dtype=torch.float32)
    few_values = torch.randint(0, 3, (vocab,), generator=gen).float()
    masked = torch.full((vocab,), float("-inf"))
    masked[torch.randint(0, vocab, (3,), generator=gen)] = torch.randn(3, generator=gen)
    half_masked = torch.randn(vocab, generator=gen)
    half_masked[vocab // 4 : 3 * vocab // 4] = float("-inf")
    zeros = torch.zeros(vocab)
    zeros[::3] = -0.0
    return torch.stack(
        [
            few_values,  # heavy ties
            torch.zeros(vocab),  # one value everywhere
            zeros,  # -0.0 ties +0.0
            masked,  # almost all -inf: the top-k ends in -inf ties
            half_masked,
            ids / vocab,  # ascending: all winners in the last blocks
            -ids / vocab,  # descending
            torch.randn(vocab, generator=gen) * 3 + 1e4,
            torch.randn(vocab, generator=gen) * 3 - 1e4,
        ]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [7, 100, 1000])
def test_random_rows(dtype, vocab):
    logits = realistic_logits(4, vocab, seed=vocab, dtype=dtype)
    if dtype != torch.float32:  # low precision: make ties common
        logits = (logits * 2).round() / 2
    token_ids = [0, vocab - 1, vocab // 2, 3 % vocab]
    check_all(logits, token_ids, [20, 0, 1, 5], k_max=20)


@pytest.mark.parametrize("config", [TINY, ROUNDS], ids=["counting", "rounds"])
@pytest.mark.parametrize("k_max", [1, 20])
def test_hard_rows(config, k_max):
    vocab = 90  # 3 chunks of 32, the last one partial
    logits = hard_rows(vocab, seed=1)
    n_rows = logits.shape[0]
    token_ids = torch.randint(0, vocab, (n_rows,), generator=torch.Generator().manual_seed(2))
    token_ids[3] = 0  # at -inf
    check_all(logits, token_ids, [k_max] * n_rows, k_max=k_max, config=config)


VARIANTS = {  # tilings and top-k paths: each must give the same answers
    "block8": ReduceConfig(chunk=64, block=8, group=2, candidates=16),
    "wide": ReduceConfig(chunk=32, block=4, group=4, candidates=128),  # ties ranked by counting too
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_variants(name):
    config = VARIANTS[name]
    vocab = 300
    logits = torch.cat([realistic_logits(3, vocab, seed=3), hard_rows(vocab, seed=4)])
    n_rows = logits.shape[0]
    token_ids = torch.arange(n_rows) * 17
    for k_max in (0, 20):
        check_all(logits, token_ids, [20, 5, 1] + [20] * (n_rows - 3), k_max=k_max, config=config)


def test_k_max_zero_matches_top_k_bits():
    """logprob, rank, logsumexp and status do not depend on k_max, to the bit."""
    logits = realistic_logits(5, 200, seed=9)
    token_ids = [0, 50, 100, 150, 199]
    without = run(logits, token_ids, [0] * 5, 0)
    with_top = run(logits, token_ids, [3] * 5, 3)
    for i in range(5):
        assert_same_bits(without, i, with_top, i, fields=("logprob", "rank", "logsumexp", "status"))


@pytest.mark.parametrize("k_max", [0, 1, 2, 3, 7, 20])
def test_k_max_range(k_max):
    logits = realistic_logits(2, 50, seed=k_max)
    out = check_all(logits, [3, 49], [k_max, k_max // 2], k_max=k_max)
    assert out.top_ids.shape == (2, k_max) and out.top_logprobs.shape == (2, k_max)


@pytest.mark.parametrize("vocab", [5, 31, 33])
def test_vocab_smaller_than_or_not_a_multiple_of_the_chunk(vocab):
    logits = realistic_logits(1, vocab, seed=vocab)  # N = 1 as well
    check_all(logits, [vocab - 1], [vocab], k_max=20)


def test_tokens_near_chunk_boundaries():
    vocab, chunk = 100, TINY.chunk
    tokens = [chunk - 1, chunk, chunk + 1, 2 * chunk - 1, 2 * chunk, 3 * chunk, vocab - 1]
    logits = (realistic_logits(len(tokens), vocab, seed=5) * 2).round() / 2  # ties around the token
    logits[1, chunk - 1] = logits[1, chunk]
    logits[1, chunk + 1] = logits[1, chunk]
    check_all(logits, tokens, [3] * len(tokens), k_max=3)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy sees inf - inf
def test_status_rows():
    vocab = 40
    logits = realistic_logits(6, vocab, seed=7)
    logits[0, 5] = float("nan")
    logits[1, 39] = float("inf")
    logits[2] = float("-inf")
    logits[5, 0] = float("nan")
    out = check_all(logits, [1, 1, 1, vocab, -1, 99], [4] * 6, k_max=4)
    assert out.status.tolist() == [1, 1, 1, 2, 2, 1]


def check_row_mask_leaves_other_rows_untouched(
    logits: torch.Tensor, config: ReduceConfig, mask_dtype: torch.dtype = torch.bool
) -> None:
    n_rows, vocab = logits.shape
    k_max = 5
    out = LogprobBuffers.allocate(n_rows, k_max, vocab, logits.device, config)
    for field in (out.logprob, out.logsumexp, out.top_logprobs):
        field.fill_(123.25)
    for field in (out.rank, out.top_ids, out.status):
        field.fill_(77)
    poisoned = {name: getattr(out, name).clone() for name in FIELDS}
    mask = (torch.arange(n_rows) % 2 == 1).to(logits.device)
    token_ids = torch.arange(n_rows) + 1
    run(logits, token_ids, [k_max] * n_rows, k_max, row_mask=mask.to(mask_dtype), out=out)
    for name in FIELDS:
        assert torch.equal(getattr(out, name)[~mask], poisoned[name][~mask]), name
    for i in range(1, n_rows, 2):
        assert_row_matches(logits, out, i, i + 1, k_max)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64])  # int64: the runner's staged flag
def test_row_mask_leaves_other_rows_untouched(mask_dtype):
    check_row_mask_leaves_other_rows_untouched(realistic_logits(4, 70, seed=11), TINY, mask_dtype)


FIELDS = ("logprob", "rank", "logsumexp", "top_ids", "top_logprobs", "status")


def assert_same_bits(a: LogprobBuffers, i: int, b: LogprobBuffers, j: int, fields=FIELDS) -> None:
    for name in fields:
        x, y = getattr(a, name)[i], getattr(b, name)[j]
        if x.is_floating_point():
            x, y = x.view(torch.int32), y.view(torch.int32)
        assert torch.equal(x, y), name


def check_determinism(logits, token_ids, num_top, k_max, config, row: int) -> None:
    """Row `row` alone, inside the whole batch, and the batch again: identical bits."""
    batch = run(logits, token_ids, num_top, k_max, config)
    again = run(logits, token_ids, num_top, k_max, config)
    alone = run(logits[row : row + 1].clone(), token_ids[row : row + 1], num_top[row : row + 1], k_max, config)
    assert_same_bits(alone, 0, batch, row)
    for i in range(logits.shape[0]):
        assert_same_bits(again, i, batch, i)


def test_bitwise_determinism_in_a_batch_of_64():
    vocab = 64
    logits = realistic_logits(64, vocab, seed=13)
    token_ids = torch.randint(0, vocab, (64,), generator=torch.Generator().manual_seed(14))
    num_top = torch.zeros(64, dtype=torch.int64)
    num_top[[0, 17, 63]] = 3  # top-k only on a few rows keeps the interpreter fast
    check_determinism(logits, token_ids, num_top, 3, TINY, row=17)


def test_torch_reference_matches_host_reference():
    logits = torch.cat([realistic_logits(3, 300, seed=17), hard_rows(300, seed=18)])
    n_rows = logits.shape[0]
    token_ids = torch.arange(n_rows) * 13
    token_ids[-1] = 300
    num_top = torch.full((n_rows,), 20)
    out = reduce_logprobs_reference(logits, token_ids, num_top, 20)
    for i in range(n_rows):
        assert_row_matches(logits, out, i, int(token_ids[i]), 20)


def sorted_reduction(logits, token_ids, num_top, k_max) -> dict[str, torch.Tensor]:
    """The oracle: every field by a full stable sort of each row in float64."""
    vocab = logits.shape[1]
    x = logits.double()
    x = torch.where(x == 0, 0.0, x)  # -0.0 ties +0.0
    token = token_ids.long()
    invalid = x.isnan().any(1) | x.isposinf().any(1) | x.isneginf().all(1)
    lse = torch.logsumexp(x, 1)
    values, order = torch.sort(x, dim=1, descending=True, stable=True)
    ok = ~invalid & (token >= 0) & (token < vocab)
    position = (order == token.clamp(0, vocab - 1)[:, None]).int().argmax(1)
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    width = min(k_max, vocab)
    wanted = torch.arange(k_max) < num_top.long().clamp(0, width)[:, None]
    pad = lambda t, value: torch.nn.functional.pad(t[:, :width], (0, k_max - width), value=value)
    top_lp = torch.where(invalid[:, None], nan, pad(values, float("-inf")) - lse[:, None])
    return {
        "status": torch.where(invalid, 1, torch.where(ok | invalid, 0, 2)).to(torch.int8),
        "logsumexp": torch.where(invalid, nan, lse).float(),
        "logprob": torch.where(ok, x.gather(1, token.clamp(0, vocab - 1)[:, None])[:, 0] - lse, nan).float(),
        "rank": torch.where(ok, 1 + position, -1).int(),
        "top_ids": torch.where(wanted & ~invalid[:, None], pad(order, -1), -1).int(),
        "top_logprobs": torch.where(wanted, top_lp, float("-inf")).float(),
    }


def oracle_rows(vocab: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Realistic rows, hard_rows, and rows of huge values (ties at both ends), NaN, +inf and only -inf."""
    gen = torch.Generator().manual_seed(seed)
    huge = torch.where(torch.rand(vocab, generator=gen) < 0.5, 3e38, -3e38)
    nan, posinf = torch.randn(2, vocab, generator=gen)
    nan[vocab // 2], posinf[vocab - 1] = float("nan"), float("inf")
    special = torch.stack([huge, (torch.rand(vocab, generator=gen) * 2 - 1) * 3e38, nan, posinf])
    rows = torch.cat(
        [realistic_logits(3, vocab, seed), hard_rows(vocab, seed), special, torch.full((1, vocab), -torch.inf)]
    )
    return rows.to(dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [(1, torch.float32), (2, torch.float32), (3, torch.bfloat16), (37, torch.float16), (1000, torch.bfloat16),
     (1000, torch.float32), (QWEN_VOCAB, torch.float32)],
)  # fmt: skip
def test_reference_gives_the_full_sorts_bits(vocab, dtype):
    """reduce_logprobs_reference (O(V): counts, and a top-k among block-maxima candidates) against sorted_reduction,
    bit for bit, into poisoned buffers, every row (some masked off, left as they were): ties, -0.0, -inf, huge
    values, NaN, +inf and all -inf rows; tokens at ties, at -inf and out of range; num_top from negative to past
    k_max; k_max from 0 to past the vocabulary (and past the number of blocks)."""
    logits = oracle_rows(vocab, vocab, dtype)
    n_rows = logits.shape[0]
    gen = torch.Generator().manual_seed(vocab + 1)
    token_ids = torch.randint(0, vocab, (n_rows,), generator=gen)
    token_ids[[1, 2]] = torch.tensor([-1, vocab])
    token_ids[8] = int(logits[8].float().isneginf().nonzero()[0]) if logits[8].isneginf().any() else 0
    for k_max in sorted({0, 1, 5, 20, vocab, vocab + 3}):
        num_top = torch.randint(-2, k_max + 4, (n_rows,), generator=gen)
        num_top[0] = k_max
        mask = torch.rand(n_rows, generator=gen) < 0.8
        out = LogprobBuffers.allocate(n_rows, k_max, vocab, "cpu")
        for field in (out.logprob, out.logsumexp, out.top_logprobs):
            field.fill_(123.25)
        for field in (out.rank, out.top_ids, out.status):
            field.fill_(77)
        poisoned = {name: getattr(out, name).clone() for name in FIELDS}
        reduce_logprobs_reference(logits, token_ids, num_top, k_max, row_mask=mask, out=out)
        want = sorted_reduction(logits, token_ids, num_top, k_max)
        for name in FIELDS:
            got, expected = (
                getattr(out, name),
                torch.where(mask.view(-1, *[1] * (want[name].dim() - 1)), want[name], poisoned[name]),
            )
            if got.is_floating_point():
                got, expected = got.view(torch.int32), expected.view(torch.int32)
            assert torch.equal(got, expected), (name, k_max)
        assert out.status[-3:][mask[-3:]].eq(1).all()  # the NaN, +inf and all -inf rows


def test_out_with_the_wrong_size_is_refused():
    out = LogprobBuffers.allocate(2, 3, 50, "cpu", TINY)
    with pytest.raises(ValueError, match="out is sized for"):
        run(realistic_logits(2, 50, seed=0), [0, 1], [1, 1], k_max=4, out=out)


# --- H200 / any CUDA device: the real vocabulary -------------------------------------------------


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_full_vocabulary(dtype):
    n_rows = 64
    logits = torch.cat(
        [realistic_logits(n_rows - 9, QWEN_VOCAB, seed=21, dtype=dtype), hard_rows(QWEN_VOCAB, seed=22).to(dtype)]
    ).cuda()
    token_ids = torch.randint(0, QWEN_VOCAB, (n_rows,), generator=torch.Generator().manual_seed(23))
    num_top = torch.tensor([20, 0, 1, 5, 17, 20, 20, 2] * 8)
    out = check_all(logits, token_ids.cuda(), num_top.cuda(), 20, ReduceConfig())
    assert out.status.eq(0).all()
    check_determinism(logits, token_ids.cuda(), num_top.cuda(), 20, ReduceConfig(), row=37)
    without_pdl = run(logits, token_ids.cuda(), num_top.cuda(), 20, ReduceConfig(pdl=False))
    for i in range(n_rows):
        assert_same_bits(out, i, without_pdl, i)


GPU_VARIANTS = {
    "no_pdl_first": ReduceConfig(pdl_first=False),
    "finish_warps_16": ReduceConfig(finish_warps=16),
}


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_VARIANTS))
def test_gpu_config_variants(name):
    logits = torch.cat([realistic_logits(7, QWEN_VOCAB, seed=51), hard_rows(QWEN_VOCAB, seed=52)]).cuda()
    n_rows = logits.shape[0]
    token_ids = torch.randint(0, QWEN_VOCAB, (n_rows,), generator=torch.Generator().manual_seed(53)).cuda()
    num_top = torch.tensor([20, 5, 1, 20, 3, 20, 0, 20] * 2).cuda()
    for k_max in (0, 20):
        check_all(logits, token_ids, num_top, k_max, GPU_VARIANTS[name])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_k_max_zero_matches_top_k_bits(dtype):
    """logprob, rank, logsumexp and status do not depend on k_max, to the bit."""
    logits = realistic_logits(32, QWEN_VOCAB, seed=61, dtype=dtype).cuda()
    token_ids = torch.randint(0, QWEN_VOCAB, (32,), generator=torch.Generator().manual_seed(62)).cuda()
    without = run(logits, token_ids, torch.zeros(32, dtype=torch.int64).cuda(), 0, ReduceConfig())
    with_top = run(logits, token_ids, torch.full((32,), 5).cuda(), 5, ReduceConfig())
    for i in range(32):
        assert_same_bits(without, i, with_top, i, fields=("logprob", "rank", "logsumexp", "status"))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [True, False])
def test_gpu_status_and_row_mask(pdl):
    config = ReduceConfig(pdl=pdl)
    logits = realistic_logits(8, QWEN_VOCAB, seed=31).cuda()
    logits[0, 100_000] = float("nan")
    logits[1, 5] = float("inf")
    logits[2] = float("-inf")
    token_ids = torch.tensor([1, 2, 3, QWEN_VOCAB, -5, 6, 7, 8])
    out = check_all(logits, token_ids.cuda(), torch.full((8,), 20).cuda(), 20, config)
    assert out.status.tolist() == [1, 1, 1, 2, 2, 0, 0, 0]
    check_row_mask_leaves_other_rows_untouched(logits, config, torch.int64)


@gpu
@pytest.mark.gpu
def test_gpu_cuda_graph_capture_allocates_nothing():
    n_rows, k_max = 32, 20
    logits = realistic_logits(n_rows, QWEN_VOCAB, seed=41).cuda()
    token_ids = torch.arange(n_rows, device="cuda") * 1000
    num_top = torch.full((n_rows,), k_max, device="cuda")
    out = LogprobBuffers.allocate(n_rows, k_max, QWEN_VOCAB, "cuda")
    reduce_logprobs(logits, token_ids, num_top, k_max, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reduce_logprobs(logits, token_ids, num_top, k_max, out=out)
    logits.copy_(realistic_logits(n_rows, QWEN_VOCAB, seed=42).cuda())
    before = torch.cuda.memory_allocated()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    for i in range(n_rows):
        assert_row_matches(logits, out, i, i * 1000, k_max)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy sees inf - inf
@pytest.mark.parametrize("vocab", [1, 2, 33])
def test_every_field_of_every_row_is_written_over_poisoned_buffers(vocab):
    """Fresh buffers already hold what status != 0 rows and the columns past num_top expect (NaN / -1 / -inf),
    so an unwritten field would pass; here every field starts as poison, and each row (ok, NaN, all -inf, a bad
    token; num_top 0, negative, past k_max and past the vocabulary) must overwrite it."""
    k_max = 6
    logits = realistic_logits(8, vocab, seed=vocab + 70)
    logits[1, vocab // 2] = float("nan")
    logits[2] = float("-inf")
    token_ids = [0, 0, 0, vocab, -3, vocab - 1, vocab // 2, 0]
    num_top = [k_max, 3, k_max, 2, k_max, 0, -4, k_max + 5]
    out = LogprobBuffers.allocate(8, k_max, vocab, "cpu", TINY)
    for field in (out.logprob, out.logsumexp, out.top_logprobs):
        field.fill_(123.25)
    for field in (out.rank, out.top_ids, out.status):
        field.fill_(77)
    for field in vars(out.workspace).values():
        if isinstance(field, torch.Tensor):
            field.fill_(float("nan") if field.is_floating_point() else -77)
    run(logits, token_ids, num_top, k_max, out=out)
    for i in range(8):
        assert_row_matches(logits, out, i, token_ids[i], max(num_top[i], 0))
    assert out.status.tolist() == [0, 1, 1, 2, 2, 0, 0, 0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy sees -3e38 - 3e38 overflow
@pytest.mark.parametrize("config", [TINY, ROUNDS], ids=["counting", "rounds"])
def test_huge_finite_logits_match_the_torch_reference(config):
    """+-3e38 (fp32's edge): a chunk's exp sums and the merge's shifts must not overflow to inf or NaN; logprobs
    of -3e38 tokens below a 3e38 peak are -inf in fp32, as the float64 reference rounds them. Ids, ranks and
    statuses exactly, logsumexp to fp32 rounding."""
    vocab = 70
    gen = torch.Generator().manual_seed(81)
    logits = (torch.rand(5, vocab, generator=gen) * 2 - 1) * 3e38
    logits[1] = torch.where(torch.rand(vocab, generator=gen) < 0.5, 3e38, -3e38)  # ties at both ends
    logits[2] = torch.randn(vocab, generator=gen)
    logits[2, [5, 40]] = 3.4e38  # a lone huge peak over ordinary values, in two chunks
    logits[3] = float("-inf")
    logits[3, [0, vocab - 1]] = -3.4e38  # only the most negative finite values
    logits[4, : vocab // 2] = float("-inf")
    token_ids = torch.tensor([3, 7, 40, vocab - 1, vocab - 2])
    num_top = torch.tensor([5, 5, 2, 5, 5])
    got = run(logits, token_ids, num_top, 5, config)
    want = reduce_logprobs_reference(logits, token_ids, num_top, 5)
    assert got.status.tolist() == want.status.tolist() == [0] * 5
    assert torch.equal(got.rank, want.rank) and torch.equal(got.top_ids, want.top_ids)
    torch.testing.assert_close(got.logsumexp, want.logsumexp, rtol=1e-6, atol=0)
    torch.testing.assert_close(got.logprob, want.logprob, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.top_logprobs, want.top_logprobs, rtol=1e-6, atol=1e-6)
