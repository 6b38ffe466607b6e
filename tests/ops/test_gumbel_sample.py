"""The fused Gumbel-max sampler against `sample_reference` (Triton in the interpreter on the CPU): the same
hash bits at every token id, the same noise to within float rounding, and so the same tokens except where
two tokens' logit + noise nearly tie."""

import pytest
import torch
import triton
import triton.language as tl

from qwen3_runtime import ops
from qwen3_runtime.ops import gumbel_sample as kernel
from qwen3_runtime.ops.gumbel_sample import CHUNK, gumbel_from_bits, row_key, token_bits
from qwen3_runtime.sampler import (
    GREEDY_BELOW,
    NOISE_BITS,
    SamplingTensors,
    filter_cutoffs,
    gumbel_noise,
    hash_bits,
    processed_logits,
    sample,
    sample_raw,
    sample_reference,
    sample_selected,
)

VOCAB = 151_936
# A row whose hash reaches its largest value (k = 2**23 - 1) at token 124065 (tests/test_sampler.py).
EXTREME = (663376102493142038, 820)
NEAR_TIE = 1e-5  # a top-2 gap of logit + noise under which the noise's rounding may pick either token


@triton.jit
def _bits_and_noise_kernel(seed_ptr, position_ptr, bits_ptr, noise_ptr, vocab, BLOCK: tl.constexpr):
    """The kernel's own hash and noise helpers over a block of token ids, stored for the comparison."""
    row = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    bits = token_bits(row_key(tl.load(seed_ptr + row), tl.load(position_ptr + row)), ids)
    noise = gumbel_from_bits(bits >> (32 - NOISE_BITS), NOISE_BITS, not ops.TRITON_INTERPRET)
    tl.store(bits_ptr + row * vocab + ids, bits.to(tl.int64), mask=ids < vocab)
    tl.store(noise_ptr + row * vocab + ids, noise, mask=ids < vocab)


def _params(rows: int, temperature: float = 1.0, seed: int = 0, position: int = 5) -> SamplingTensors:
    full = lambda v, dtype: torch.full((rows,), v, dtype=dtype)
    seeds = torch.arange(rows, dtype=torch.int64) * 7919 + seed
    return SamplingTensors(full(temperature, torch.float32), full(-1, torch.int32), full(1.0, torch.float32),
                           seeds, full(position, torch.int64), full(0.0, torch.float32))  # fmt: skip


def _top2_gap(processed: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """[B] the reference's gap between the largest and second-largest logit + noise."""
    noise = gumbel_noise(params.seed, params.position, processed.shape[-1])
    noise.masked_fill_((params.temperature < GREEDY_BELOW)[:, None], 0.0)
    top2 = (processed + noise).topk(2, dim=-1).values
    return top2[:, 0] - top2[:, 1]


def _check(processed: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Kernel tokens equal the reference's on every row that is no near-tie; returns them."""
    tokens, ref = sample(processed, params), sample_reference(processed, params)
    assert tokens.dtype == torch.int64 and tokens.shape == ref.shape
    clear = _top2_gap(processed, params) > NEAR_TIE if processed.shape[-1] > 1 else torch.ones_like(ref, dtype=bool)
    clear |= processed.isnan().any(-1) | (processed == float("inf")).sum(-1).eq(1)
    assert torch.equal(tokens[clear], ref[clear]), (tokens[clear] != ref[clear]).nonzero()
    return tokens


def test_hash_bits_and_noise_match_the_reference_at_every_token_id():
    seed = torch.tensor([EXTREME[0], 0, -(2**62) - 3, 2**63 - 1])
    position = torch.tensor([EXTREME[1], 0, 40_959, 2**31 + 7])
    bits = torch.empty(4, VOCAB, dtype=torch.int64)
    noise = torch.empty(4, VOCAB)
    block = 16384
    _bits_and_noise_kernel[(4, triton.cdiv(VOCAB, block))](seed, position, bits, noise, VOCAB, BLOCK=block)
    assert torch.equal(bits, hash_bits(seed, position, VOCAB))
    assert bits[0, 124065] >> (32 - NOISE_BITS) == (1 << NOISE_BITS) - 1  # the largest k, the smallest E
    ref = gumbel_noise(seed, position, VOCAB)
    assert torch.isfinite(noise).all()
    torch.testing.assert_close(noise, ref, rtol=4e-7, atol=2e-7)  # log and log1p may round differently


@pytest.mark.parametrize("rows, vocab", [(1, 1), (1, 100), (3, CHUNK), (5, 2 * CHUNK + 77)])
def test_random_logits_match_the_reference(rows, vocab):
    gen = torch.Generator().manual_seed(vocab)
    processed = torch.randn(rows, vocab, generator=gen) * 3
    _check(processed, _params(rows, seed=vocab))


def test_tokens_differ_from_the_reference_only_at_near_ties():
    """Many small rows: equal-ish logits make near-ties of logit + noise likely."""
    rows, vocab = 96, 40
    processed = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)) * 0.1
    params = _params(rows, seed=3)
    tokens, ref = sample(processed, params), sample_reference(processed, params)
    differ = tokens != ref
    assert differ.float().mean() < 0.05 and (_top2_gap(processed, params)[differ] <= NEAR_TIE).all()


def test_masked_tokens_are_never_sampled_unless_the_whole_row_is():
    rows, vocab = 7, CHUNK + 300
    processed = torch.full((rows, vocab), float("-inf"))
    allowed = [[3], [CHUNK + 299], [0, 5, CHUNK + 1], [10, 11, 12, 13], [vocab - 1, 1], [], [CHUNK]]
    for row, ids in enumerate(allowed):
        processed[row, ids] = torch.randn(len(ids), generator=torch.Generator().manual_seed(row))
    params = _params(rows)
    params.temperature[6] = 0.0  # a greedy row with one finite logit
    tokens = _check(processed, params).tolist()
    assert all(token in ids for token, ids in zip(tokens, allowed) if ids)
    assert tokens[5] == 0  # every logit -inf: id 0, as torch.argmax; the runner reports the row as not finite


def test_greedy_and_random_rows_mix():
    rows, vocab = 5, CHUNK + 9
    processed = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(2))
    processed[:, [7, CHUNK + 4]] = 5.0  # a tie across chunks: greedy rows take the lower id
    params = _params(rows)
    params.temperature[[0, 3]] = torch.tensor([0.0, GREEDY_BELOW * 0.99])
    tokens = _check(processed, params)
    assert tokens[[0, 3]].tolist() == [7, 7]
    assert (tokens[[1, 2, 4]] != 7).any()  # random rows: the noise decides


def test_ties_and_huge_values():
    rows, vocab = 4, 2 * CHUNK + 5
    processed = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(4))
    processed[0, [CHUNK + 3, 9, 2 * CHUNK + 1]] = 1e30  # + noise rounds back to 1e30: a tie, the lower id
    processed[1, 17], processed[1, 18] = -1e30, 1e30
    processed[2, :] = 2.5  # all tied: the noise decides, as in the reference
    processed[3, [4, 2 * CHUNK + 4]] = -1e30
    params = _params(rows)
    tokens = _check(processed, params)
    assert tokens[:2].tolist() == [9, 18] and tokens[3] not in (4, 2 * CHUNK + 4)
    params.temperature[:] = 0.0
    assert _check(processed, params)[:3].tolist() == [9, 18, 0]


def test_non_finite_rows_follow_torch_argmax():
    rows, vocab = 3, CHUNK + 50
    processed = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(5))
    processed[0, [CHUNK + 7, CHUNK + 20]] = float("nan")  # the first NaN's id
    processed[0, 3] = 1e30
    processed[1, CHUNK + 40] = float("inf")  # + noise stays +inf
    processed[2, [6, CHUNK + 2]] = float("nan")
    params = _params(rows)
    params.temperature[2] = 0.0
    assert _check(processed, params).tolist() == [CHUNK + 7, CHUNK + 40, 6]


def test_every_output_is_written(monkeypatch):
    """Scratch and output buffers start as poison: -7 for ids, NaN for values."""
    empty = torch.empty

    def poisoned(*shape, dtype=None, **kw):
        out = empty(*shape, dtype=dtype, **kw)
        return out.fill_(float("nan") if out.is_floating_point() else -7)

    monkeypatch.setattr(kernel.torch, "empty", poisoned)
    processed = torch.randn(3, 3 * CHUNK + 1, generator=torch.Generator().manual_seed(6))
    tokens = _check(processed, _params(3))
    assert ((tokens >= 0) & (tokens < 3 * CHUNK + 1)).all()
    assert sample(processed[:0], _params(0)).shape == (0,)


def test_a_rows_token_depends_on_its_row_alone_and_repeats():
    rows, vocab = 5, CHUNK + 13
    processed = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(7)) * 2
    params = _params(rows)
    tokens = sample(processed, params)
    assert torch.equal(sample(processed, params), tokens)  # same (seed, position): the same tokens
    order = torch.tensor([3, 0, 4, 1, 2])
    shuffled = SamplingTensors(*(t[order] for t in vars(params).values()))
    assert torch.equal(sample(processed[order], shuffled), tokens[order])
    alone = SamplingTensors(*(t[2:3] for t in vars(params).values()))
    assert sample(processed[2:3], alone).item() == tokens[2]
    later = _params(rows, position=6)
    assert not torch.equal(sample(processed, later), tokens)


def test_frequencies_follow_the_softmax():
    draws, logits = 320, torch.tensor([1.0, 0.5, 0.0, -1.0, float("-inf")])
    tokens = sample(logits.expand(draws, 5).contiguous(), _params(draws, seed=11))
    counts = torch.bincount(tokens, minlength=5).double()
    assert counts[4] == 0
    expected = logits[:4].double().softmax(0) * draws
    stat = ((counts[:4] - expected) ** 2 / expected).sum()
    assert torch.special.gammaincc(torch.tensor(1.5, dtype=torch.float64), stat / 2) > 1e-3  # chi-square, 3 dof


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 33])
def test_matches_the_reference_on_gpu_at_qwen3_vocab(rows):
    gen = torch.Generator().manual_seed(rows)
    processed = (torch.randn(rows, VOCAB, generator=gen) * 3).cuda()
    processed[0, torch.randperm(VOCAB, generator=gen)[:100_000]] = float("-inf")
    params = SamplingTensors(*(t.cuda() for t in vars(_params(rows)).values()))
    params.temperature[::3] = 0.0
    params.seed[0], params.position[0] = EXTREME
    tokens = _check(processed, params)
    assert torch.isfinite(processed[torch.arange(rows), tokens]).all()


# Three chunks cover every path of the kernels (and the padded chunk counts); Qwen3's vocabulary, 75 chunks of
# interpreted programs, runs on the GPU below.
@pytest.mark.parametrize("vocab", [100, 2 * CHUNK + 77])
@pytest.mark.parametrize("filters", ["none", "select", "top_p"])
def test_raw_logits_sample_as_their_processed_ones_and_flagged_rows_are_written(vocab, filters):
    _check_raw_sampling(vocab, filters, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("filters", ["select", "top_p"])
def test_raw_logits_sample_as_their_processed_ones_on_gpu_at_qwen3_vocab(filters):
    _check_raw_sampling(VOCAB, filters, "cuda")


def _check_raw_sampling(vocab: int, filters: str, device: str) -> None:
    """sample_raw (the kernel's scaling, min-p, top-k/top-p cutoff and noise in one pass; the cutoffs from
    filter_cutoffs' sort), or sample_selected for top-k rows and top-p alone, against sample(processed_logits(...)),
    the sort-based reference: the same tokens, and the rows flagged for processed logprobs hold the reference's
    values bit for bit. Rows: greedy, plain temperature, min-p, a huge peak (shifted), a -inf and a NaN row, a row
    of ties."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(7, vocab, generator=gen) * 3
    logits[3, 5] = 3e38
    logits[4, ::3] = float("-inf")
    logits[5, vocab // 2] = float("nan")
    params = _params(7, seed=vocab)
    params.temperature.copy_(torch.tensor([0.0, 1.0, 0.7, 1e-3, 1.3, 0.5, 2.0]))
    params.min_p.copy_(torch.tensor([0.0, 0.0, 0.1, 0.0, 0.05, 0.0, 0.0]))
    logits[6] = torch.randint(-2, 2, (vocab,), generator=gen).float()  # ties
    write_rows = torch.tensor([1, 0, 1, 1, 1, 0, 1])
    if filters == "select":  # rows 3 and 5 ask top-p alone, so their processed logits are not written
        params.top_k.copy_(torch.tensor([5, 1, 7, -1, 64, -1, 20]))
        params.top_p[2:].fill_(0.8)
        write_rows[3] = 0
    elif filters == "top_p":
        params.top_p.copy_(torch.tensor([0.5, 0.9, 0.3, 0.95, 0.7, 1.0, 0.6]))
    logits, write_rows = logits.to(device), write_rows.to(device)
    params = SamplingTensors(*(t.to(device) for t in vars(params).values()))
    peak = logits.amax(dim=-1)
    processed = processed_logits(logits, params, peak, filtered=filters != "none")
    expected = _check(processed, params)

    raw = logits.clone()
    if filters == "select":  # the candidates, the full pass for the rows they write, the rounds for top-p alone
        tokens = sample_selected(raw, params, write_rows, raw, cap=64)[1]
    else:
        tokens = sample_raw(
            raw, params, peak, write_rows, filter_cutoffs(raw, params, peak) if filters != "none" else None
        )

    clear = _top2_gap(processed, params) > NEAR_TIE
    assert torch.equal(tokens[clear], expected[clear])
    flagged = write_rows != 0
    assert torch.equal(raw[flagged].isnan(), processed[flagged].isnan())
    assert torch.equal(raw[flagged].nan_to_num(), processed[flagged].nan_to_num())
    assert torch.equal(raw[~flagged].nan_to_num(), logits[~flagged].nan_to_num())


@pytest.mark.parametrize("kernel_path", [True, False])
def test_processed_rows_go_to_write_to_and_the_input_stays(monkeypatch, kernel_path):
    """write_to (the runner's raw logits when the sampled ones are a penalized copy): the flagged random rows'
    processed values land there, its other rows are left as they were, the sampled logits are not written."""
    if not kernel_path:
        monkeypatch.setattr(ops, "TRITON_INTERPRET", False)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 2 * CHUNK + 77, generator=gen) * 3
    params = _params(4, temperature=0.7)
    params.temperature[1] = 0.0  # greedy: never written by sampling
    write_rows = torch.tensor([1, 1, 0, 1])
    before = logits.clone()
    write_to = torch.full_like(logits, float("nan"))

    tokens = sample_raw(logits, params, logits.amax(dim=-1), write_rows, write_to=write_to)
    expected = sample_reference(processed_logits(before, params, before.amax(dim=-1), False), params)

    written = torch.tensor([True, False, False, True])
    assert torch.equal(logits, before)
    assert torch.equal(write_to[written], processed_logits(before, params, before.amax(dim=-1), False)[written])
    assert write_to[~written].isnan().all()
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("vocab", [1, CHUNK + 77])
def test_processed_values_are_the_references_bit_for_bit(monkeypatch, vocab):
    """processed_values (what the top-k / top-p cutoffs are selected among) against processed_logits' unfiltered
    values, bit for bit, -0.0 stored as 0.0, into a poisoned output: plain, min-p, a huge peak (shifted), ties,
    signed zeros, a row entirely -inf."""
    empty = torch.empty
    monkeypatch.setattr(kernel.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    gen = torch.Generator().manual_seed(vocab + 1)
    logits = torch.randn(6, vocab, generator=gen) * 3
    logits[1, 0] = 3e38
    logits[2] = torch.randint(-2, 2, (vocab,), generator=gen).float()
    logits[3] = torch.where(torch.rand(vocab, generator=gen) < 0.5, -0.0, 0.0)
    logits[4] = float("-inf")
    params = _params(6, seed=vocab)
    params.temperature.copy_(torch.tensor([0.7, 1e-3, 1.3, 0.5, 1.0, 2.0]))
    params.min_p.copy_(torch.tensor([0.0, 0.1, 0.3, 0.0, 0.2, 0.05]))
    peak = logits.amax(-1)
    values = kernel.processed_values(logits, params.temperature, peak, params.min_p, GREEDY_BELOW)
    expected = processed_logits(logits, params, peak, filtered=False) + 0.0  # -0.0 as 0.0
    assert torch.equal(values.view(torch.int32), expected.view(torch.int32))


def test_done_rows_keep_their_token_and_the_others_are_sampled():
    """`done` (rows ops/top_k_sample.py sampled): their entries of `tokens` are left as they are, every other
    row's is written, whatever the poison it held."""
    rows, vocab = 5, CHUNK + 33
    processed = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(9)) * 2
    processed[3] = float("-inf")  # a masked row that is not done: token 0
    params = _params(rows)
    params.temperature[1] = 0.0
    done = torch.tensor([True, False, True, False, False])
    tokens = torch.full((rows,), -7, dtype=torch.int64)
    out = kernel.gumbel_sample(processed, params.temperature, params.seed, params.position, GREEDY_BELOW,
                               NOISE_BITS, done=done, tokens=tokens)  # fmt: skip
    assert out is tokens and (tokens[done] == -7).all()
    clear = (_top2_gap(processed, params) > NEAR_TIE) | (processed == float("-inf")).all(-1)
    expected = sample_reference(processed, params)
    assert torch.equal(tokens[~done & clear], expected[~done & clear]) and tokens[3] == 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy: log(0) (min-p off), 3e38 / 1e-3
@pytest.mark.parametrize("vocab", [100, CHUNK + 1])
def test_raw_rows_entirely_masked_or_huge_sample_and_write_as_the_reference(vocab):
    """sample_raw with cutoffs on rows entirely -inf (masked: token 0, their written values -inf), rows of +-3.4e38
    (scaled, shifted or overflowing to -inf as in PyTorch) and a greedy -inf row; flagged rows written into a
    poisoned write_to bit for bit, the others left poisoned."""
    gen = torch.Generator().manual_seed(vocab + 2)
    logits = torch.randn(6, vocab, generator=gen) * 3
    logits[0] = float("-inf")
    logits[1] = (torch.rand(vocab, generator=gen) * 2 - 1) * 3.4e38
    logits[2] = torch.where(torch.rand(vocab, generator=gen) < 0.5, 3.4e38, -3.4e38)  # ties at both ends
    logits[3] = float("-inf")
    logits[4, vocab - 1] = float("-inf")
    params = _params(6, seed=vocab)
    params.temperature.copy_(torch.tensor([0.8, 1e-3, 0.5, 0.0, 1.0, 2.0]))
    params.min_p.copy_(torch.tensor([0.1, 0.0, 0.05, 0.0, 0.2, 0.0]))
    params.top_k.copy_(torch.tensor([5, -1, 3, -1, -1, 7], dtype=torch.int32))
    params.top_p.copy_(torch.tensor([0.9, 0.5, 1.0, 1.0, 0.7, 1.0]))
    write_rows = torch.tensor([1, 1, 1, 1, 0, 1])
    peak = logits.amax(-1)
    processed = processed_logits(logits, params, peak)
    write_to = torch.full_like(logits, float("nan"))
    tokens = sample_raw(logits, params, peak, write_rows, filter_cutoffs(logits, params, peak), write_to)
    expected = sample_reference(processed, params)
    clear = (_top2_gap(processed, params) > NEAR_TIE) | (processed == float("-inf")).all(-1)
    assert torch.equal(tokens[clear], expected[clear]) and tokens[[0, 3]].tolist() == [0, 0]
    written = torch.tensor([True, True, True, False, False, True])  # greedy row 3 is never written
    assert torch.equal(write_to[written], processed[written]) and write_to[~written].isnan().all()
