"""Paged prefill attention (Triton in the interpreter on the CPU) against its fp32 reference, the reference
against naive float64 attention over the unpaged K/V, and the CPU path (SDPA) against the reference."""

import warnings

import pytest
import torch

from qwen3_runtime import ops
from qwen3_runtime.ops import prefill_attention
from qwen3_runtime.ops.prefill_attention import (
    PrefillPlan,
    attend_prefill,
    paged_prefill_attention,
    paged_prefill_attention_reference,
)
from tests.ops.conftest import PagedCache

# (cached prefix, new tokens): whole prompts, single tokens, chunks starting mid-block (prefix 1, 17, 30,
# 33, 40), lengths that are not multiples of any tile, and a sequence with nothing new. Prefix 30: the
# first query's key is the second last of a K/V tile (no whole tile before it may go unmasked).
SEQS = [(0, 1), (0, 37), (17, 5), (1, 1), (33, 20), (9, 0), (0, 16), (30, 7), (40, 3)]


class PagedSequences(PagedCache):
    """(cached prefix, new tokens) sequences' K/V paged as prefill attention reads them: every block table
    ends in -1, so any read past it shows."""

    def __init__(self, seqs, block_size, num_kv_heads, head_dim, generator, dtype=torch.float32, device="cpu"):
        self.query_lens = [n for _, n in seqs]
        self.seq_lens = [prefix + n for prefix, n in seqs]
        super().__init__(self.seq_lens, block_size, num_kv_heads, head_dim, generator, dtype, device)
        self.block_tables = [blocks + [-1] for blocks in self.tables]

    def plan(self, group_size: int, **kw) -> PrefillPlan:
        device = self.k_cache.device
        return PrefillPlan.build(self.query_lens, self.seq_lens, self.block_tables, device, group_size=group_size, **kw)


def _causal_attention_float64(q, paged, scale):
    """Naive per-sequence, per-head softmax attention in float64 over the unpaged K/V."""
    group_size = q.shape[1] // paged.dense_k[0].shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    start = 0
    for query_len, seq_len, k, v in zip(paged.query_lens, paged.seq_lens, paged.dense_k, paged.dense_v):
        for i in range(query_len):
            visible = seq_len - query_len + i + 1
            for head in range(q.shape[1]):
                scores = k[:visible, head // group_size].double() @ q[start + i, head].double() * scale
                weights = torch.exp(scores - scores.max())
                out[start + i, head] = (weights / weights.sum()) @ v[:visible, head // group_size].double()
        start += query_len
    return out


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def _inputs(block_size, num_kv_heads, group_size, head_dim, seed, dtype=torch.float32, seqs=SEQS):
    generator = torch.Generator().manual_seed(seed)
    paged = PagedSequences(seqs, block_size, num_kv_heads, head_dim, generator, dtype)
    q = torch.randn(sum(paged.query_lens), num_kv_heads * group_size, head_dim, generator=generator).to(dtype)
    return q, paged


@pytest.mark.parametrize("num_kv_heads, group_size", [(1, 1), (2, 3), (1, 8)])
def test_reference_matches_causal_float64(num_kv_heads, group_size):
    q, paged = _inputs(16, num_kv_heads, group_size, 16, seed=group_size)
    plan = paged.plan(group_size)

    out = paged_prefill_attention_reference(q, paged.k_cache, paged.v_cache, plan, 0.25)

    assert _rel_err(out, _causal_attention_float64(q, paged, 0.25)) <= 1e-5


def test_plan_tiles_cover_every_new_token_once_heaviest_first():
    query_lens, seq_lens = [n for _, n in SEQS], [p + n for p, n in SEQS]
    plan = PrefillPlan.build(query_lens, seq_lens, [[0]] * len(SEQS), torch.device("cpu"), group_size=4, block_m=32)

    assert plan.block_q == 8
    assert plan.query_start_loc.tolist() == [0, 1, 38, 43, 44, 64, 64, 80, 87, 90]
    assert plan.seq_lens.tolist() == seq_lens
    covered = sorted(
        (seq, first + i) for seq, first in plan.tiles.tolist() for i in range(8) if first + i < query_lens[seq]
    )
    assert covered == [(seq, i) for seq, n in enumerate(query_lens) for i in range(n)]
    keys = [seq_lens[s] - query_lens[s] + min(first + 8, query_lens[s]) for s, first in plan.tiles.tolist()]
    assert keys == sorted(keys, reverse=True)


# (block_size, num_kv_heads, group_size, head_dim, block_m, block_n): pages smaller than, equal to and
# larger than the K/V tile, and one (12) that neither divides nor is divided by it; GQA groups 1 to 8,
# some not dividing block_m (padded rows); the default tile sizes last.
KERNEL_CASES = [
    (4, 2, 1, 16, 16, 16),
    (16, 1, 2, 32, 32, 16),
    (32, 2, 4, 16, 32, 16),
    (16, 1, 8, 16, 64, 32),
    (32, 1, 3, 16, 32, 64),
    (12, 2, 5, 16, 64, 32),
    (16, 1, 7, 16, 32, 16),
    (4, 1, 4, 32, prefill_attention.BLOCK_M, prefill_attention.BLOCK_N),
    (32, 2, 2, 16, prefill_attention.BLOCK_M, prefill_attention.BLOCK_N),
]


@pytest.mark.parametrize("block_size, num_kv_heads, group_size, head_dim, block_m, block_n", KERNEL_CASES)
def test_kernel_matches_reference(monkeypatch, block_size, num_kv_heads, group_size, head_dim, block_m, block_n):
    monkeypatch.setattr(prefill_attention, "BLOCK_N", block_n)
    q, paged = _inputs(block_size, num_kv_heads, group_size, head_dim, seed=block_size + 10 * group_size)
    _check_kernel(q, paged, paged.plan(group_size, block_m=block_m), head_dim**-0.5, tolerance=1e-5)


def test_kernel_keeps_bf16():
    q, paged = _inputs(16, 2, 4, 32, seed=1, dtype=torch.bfloat16)
    _check_kernel(q, paged, paged.plan(4, block_m=32), 32**-0.5, tolerance=2e-2)


def test_kernel_survives_huge_logits():
    """Every score shifted by 2500 (3600 in log2 units: exp2 of it overflows fp32), their differences kept
    O(1): only a running max subtracted before the exp2 keeps the output finite and right."""
    q, paged = _inputs(16, 2, 2, 16, seed=2)
    q[..., 0] = 1e4
    for cache in (paged.k_cache, paged.v_cache):
        cache[..., 0] = torch.where(cache[..., 0].isnan(), cache[..., 0], 1.0)
    _check_kernel(q, paged, paged.plan(2, block_m=16), 0.25, tolerance=2e-3)


def test_padding_tiles_and_rows_are_left_alone():
    """A CUDA graph's plan: token rows past the real ones and tiles of sequence -1 up to the fixed grid."""
    q, paged = _inputs(16, 2, 2, 16, seed=4)
    real = q.shape[0]
    q = torch.cat([q, torch.randn(5, *q.shape[1:])])
    plan = paged.plan(2, block_m=16)
    plan.tiles = torch.cat([plan.tiles, torch.tensor([[-1, 0]] * 7, dtype=torch.int32)])
    out = torch.full_like(q, float("nan"))

    paged_prefill_attention(q, paged.k_cache, paged.v_cache, plan, 0.25, out=out)

    expected = paged_prefill_attention_reference(q[:real], paged.k_cache, paged.v_cache, plan, 0.25)
    assert _rel_err(out[:real], expected) <= 1e-5
    assert out[real:].isnan().all()


def _check_kernel(q, paged, plan, scale, tolerance):
    out = torch.full_like(q, float("nan"))  # poisoned: any row the kernel fails to write shows

    paged_prefill_attention(q, paged.k_cache, paged.v_cache, plan, scale, out=out)

    assert not out.isnan().any()
    assert _rel_err(out, paged_prefill_attention_reference(q, paged.k_cache, paged.v_cache, plan, scale)) <= tolerance


def _chunked_same_bits(device, length, chunk, num_kv_heads, group_size, head_dim, dtype):
    """One prompt's attention whole, then in chunks (each beside another sequence's chunk, as a batch puts
    them): the same bits for every token (engine.batch_invariant's prefill steps rely on it)."""
    generator = torch.Generator().manual_seed(5)
    other = 37  # the other sequence: its last 37 of 90 tokens are new in every step
    paged = PagedSequences([(0, length), (90 - other, other)], 16, num_kv_heads, head_dim, generator, dtype, device)
    q = torch.randn(length + other, num_kv_heads * group_size, head_dim, generator=generator).to(dtype).to(device)
    scale = head_dim**-0.5

    def attend(first: int, count: int) -> torch.Tensor:
        plan = PrefillPlan.build(
            [count, other], [first + count, 90], paged.block_tables, q.device, group_size=group_size
        )
        step_q = torch.cat([q[first : first + count], q[length:]])
        return paged_prefill_attention(step_q, paged.k_cache, paged.v_cache, plan, scale)[:count]

    whole = attend(0, length)
    chunked = torch.cat([attend(first, min(chunk, length - first)) for first in range(0, length, chunk)])
    assert torch.equal(chunked, whole)


def test_a_token_gets_the_same_bits_in_any_chunk():
    _chunked_same_bits("cpu", 150, 48, 1, 2, 16, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_token_gets_the_same_bits_in_any_chunk_on_gpu():
    """Qwen3-0.6B's heads (16 over 8 KV heads, head_dim 128), bf16: where the compiler may fuse arithmetic."""
    _chunked_same_bits("cuda", 700, 48, 8, 2, 128, torch.bfloat16)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cpu_path_matches_reference(monkeypatch, dtype, tolerance):
    monkeypatch.setattr(ops, "TRITON_INTERPRET", False)
    q, paged = _inputs(4, 2, 4, 32, seed=3, dtype=dtype)
    plan = paged.plan(4)

    out = paged_prefill_attention(q, paged.k_cache, paged.v_cache, plan, 32**-0.5)

    assert out.dtype == dtype and not out.isnan().any()
    assert (
        _rel_err(out, paged_prefill_attention_reference(q, paged.k_cache, paged.v_cache, plan, 32**-0.5)) <= tolerance
    )


def test_kernel_returns_nothing_for_no_new_tokens():
    q, paged = _inputs(16, 2, 2, 16, seed=4, seqs=[(5, 0)])

    out = paged_prefill_attention(q, paged.k_cache, paged.v_cache, paged.plan(2), 0.25)

    assert out.shape == (0, 4, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_matches_reference_on_gpu_bf16():
    """Qwen3-4B attention shapes (32 query heads over 8 KV heads, head_dim 128, bf16, block 16): a whole
    prompt, chunks after long cached prefixes (one mid-block), one token after a prefix."""
    generator = torch.Generator().manual_seed(0)
    seqs = [(0, 3000), (2048, 1500), (3001, 999), (4000, 1), (17, 2100)]
    paged = PagedSequences(seqs, 16, 8, 128, generator, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(sum(n for _, n in seqs), 32, 128, generator=generator).bfloat16().cuda()
    plan = paged.plan(4)

    out = paged_prefill_attention(q, paged.k_cache, paged.v_cache, plan, 128**-0.5)

    expected = paged_prefill_attention_reference(q, paged.k_cache, paged.v_cache, plan, 128**-0.5).float()
    assert not out.isnan().any()
    assert ((out.float() - expected).norm() / expected.norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "seqs, invariant",
    [
        ([(0, 2049)], False),
        ([(40, 3), (0, 2500), (0, 4999), (500, 1)], False),  # cuDNN takes the longest, the kernel the rest
        ([(0, 3001), (17, 60)], True),
    ],
)
def test_long_sequence_without_prefix_goes_to_cudnn_on_gpu(monkeypatch, seqs, invariant):
    """Qwen3-4B's attention shape, q, k and v as views of one qkv row as the model passes them, at lengths
    cuDNN's one plan for every length was not built for: the output matches the reference, the paged kernel
    runs only beside cuDNN (skipping its sequence) or in batch-invariant mode."""
    generator = torch.Generator().manual_seed(0)
    paged = PagedSequences(seqs, 16, 8, 128, generator, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(sum(n for _, n in seqs), 32, 128, generator=generator).bfloat16().cuda()
    new_k, new_v = (
        torch.cat([dense[prefix:] for dense, (prefix, _) in zip(cache, seqs)])
        for cache in (paged.dense_k, paged.dense_v)
    )
    qkv = torch.cat([q.flatten(1), new_k.flatten(1), new_v.flatten(1)], dim=1)
    q, k, v = (part.unflatten(1, (-1, 128)) for part in qkv.split([32 * 128, 8 * 128, 8 * 128], dim=1))
    plan = paged.plan(4)
    skipped = []
    paged_kernel = prefill_attention.paged_prefill_attention
    monkeypatch.setattr(
        prefill_attention,
        "paged_prefill_attention",
        lambda *a, skip_seq=-1: skipped.append(skip_seq) or paged_kernel(*a, skip_seq=skip_seq),
    )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = prefill_attention.attend_prefill(q, k, v, paged.k_cache, paged.v_cache, plan, 128**-0.5, invariant)

    expected = paged_prefill_attention_reference(q, paged.k_cache, paged.v_cache, plan, 128**-0.5).float()
    assert out.shape == q.shape and not out.isnan().any()
    for b, start, query_len, _ in prefill_attention._sequences(plan):
        rows = slice(start, start + query_len)
        assert ((out[rows].float() - expected[rows]).norm() / expected[rows].norm()).item() < 1e-2, b
    assert skipped == ([-1] if invariant else [2] if len(seqs) > 1 else [])
    # cuDNN's one plan for every length (TORCH_CUDNN_SDPA_AVOID_RECOMPILE) needs this layout; it warns if not.
    assert not [w for w in caught if "Falling back to regular dense case" in str(w.message)]


@pytest.mark.parametrize("interpret", [True, False])
def test_the_skipped_sequence_is_left_unwritten(monkeypatch, interpret):
    """skip_seq (attend_prefill's cuDNN sequence): its rows keep what `out` held, the others are attended."""
    monkeypatch.setattr(ops, "TRITON_INTERPRET", interpret)
    q, paged = _inputs(16, 2, 2, 16, seed=6)
    plan = paged.plan(2, block_m=16)
    out = torch.full_like(q, float("nan"))

    paged_prefill_attention(q, paged.k_cache, paged.v_cache, plan, 0.25, out=out, skip_seq=1)

    skipped = slice(SEQS[0][1], SEQS[0][1] + SEQS[1][1])
    assert out[skipped].isnan().all()
    out[skipped] = 0.0
    expected = paged_prefill_attention_reference(q, paged.k_cache, paged.v_cache, plan, 0.25)
    expected[skipped] = 0.0
    assert _rel_err(out, expected) <= 1e-5


def test_chunks_and_cpu_tensors_go_to_the_paged_path():
    """A chunk after a cached prefix, several prompts or a short one take the paged kernel (here its CPU
    path)."""
    for seqs in ([(5, 7)], [(0, 9), (0, 4)], [(0, 12)]):
        q, paged = _inputs(4, 2, 2, 16, seed=3, seqs=seqs)
        plan = paged.plan(2)
        k = torch.zeros(q.shape[0], 2, 16)  # not read by the paged path
        out = attend_prefill(q, k, k, paged.k_cache, paged.v_cache, plan, 0.25)
        torch.testing.assert_close(out, paged_prefill_attention(q, paged.k_cache, paged.v_cache, plan, 0.25))


@pytest.mark.parametrize("head_dim, num_kv_heads, group_size", [(24, 2, 2), (40, 1, 3)])
def test_head_dims_that_are_not_powers_of_two(head_dim, num_kv_heads, group_size):
    """The tiny model's 24: BLOCK_D is padded past the head dim, in the unmasked loop as in the causal one."""
    q, paged = _inputs(16, num_kv_heads, group_size, head_dim, seed=head_dim)
    _check_kernel(q, paged, paged.plan(group_size, block_m=16), head_dim**-0.5, tolerance=1e-5)
    assert (
        _rel_err(
            paged_prefill_attention(
                q, paged.k_cache, paged.v_cache, paged.plan(group_size, block_m=16), head_dim**-0.5
            ),
            _causal_attention_float64(q, paged, head_dim**-0.5),
        )
        <= 1e-5
    )
