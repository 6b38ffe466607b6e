import pytest
import torch

from qwen3_runtime.ops import decode_attention
from qwen3_runtime.ops.decode_attention import (
    BLOCK_N,
    FEW_PAIRS_SPLITS,
    LONG_ROW_TOKENS,
    MAX_SPLITS,
    decode_workspace,
    default_num_splits,
    long_row_splits,
    paged_decode_attention,
    paged_decode_attention_reference,
)
from tests.ops.conftest import PagedCache

# Not multiples of any block size, one token, empty (padded) rows, an exact multiple,
# and one long enough for several tiles per split.
SEQ_LENS = [37, 1, 0, 200, 64]
HEAD_DIM = 16


class PagedKV(PagedCache):
    """The rows' K/V paged as decode attention reads them: block tables padded with -1 (any read of a tail
    shows) and sequence lengths, as device tensors."""

    def __init__(self, seq_lens, block_size, num_kv_heads, head_dim, generator, dtype=torch.float32, device="cpu"):
        super().__init__(seq_lens, block_size, num_kv_heads, head_dim, generator, dtype, device)
        self.block_tables = torch.full((len(seq_lens), max(map(len, self.tables)) + 1), -1, dtype=torch.int32)
        for row, blocks in enumerate(self.tables):
            self.block_tables[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        self.block_tables = self.block_tables.to(device)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)

    def caches(self) -> tuple[torch.Tensor, ...]:
        """k_cache, v_cache, block_tables, seq_lens: the kernel's cache arguments, in order."""
        return self.k_cache, self.v_cache, self.block_tables, self.seq_lens


def _dense_attention_float64(q, dense_k, dense_v, scale):
    """Naive per-head softmax attention in float64 over the unpaged K/V."""
    batch, num_heads, head_dim = q.shape
    group_size = num_heads // dense_k[0].shape[1]
    out = torch.zeros(batch, num_heads, head_dim, dtype=torch.float64)
    for row in range(batch):
        if len(dense_k[row]) == 0:
            continue
        for head in range(num_heads):
            k = dense_k[row][:, head // group_size].double()
            v = dense_v[row][:, head // group_size].double()
            scores = k @ q[row, head].double() * scale
            weights = torch.exp(scores - scores.max())
            out[row, head] = (weights / weights.sum()) @ v
    return out


def _max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("num_kv_heads, group_size", [(1, 1), (2, 2), (1, 3), (2, 4), (1, 8)])
def test_reference_matches_dense_float64(block_size, num_kv_heads, group_size):
    generator = torch.Generator().manual_seed(block_size * 10 + group_size)
    kv = PagedKV(SEQ_LENS, block_size, num_kv_heads, HEAD_DIM, generator)
    q = torch.randn(len(SEQ_LENS), num_kv_heads * group_size, HEAD_DIM, generator=generator)
    scale = HEAD_DIM**-0.5

    out = paged_decode_attention_reference(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale)

    assert _max_rel_err(out, _dense_attention_float64(q, kv.dense_k, kv.dense_v, scale)) <= 1e-5


# (block_size, num_kv_heads, group_size, num_splits): every block size, GQA groups 1 to 8
# with 1 and 2 KV heads, one split, several, and more splits than the rows have blocks.
KERNEL_CASES = [
    (8, 1, 1, 1),
    (8, 2, 4, 3),
    (8, 1, 8, 16),
    (16, 2, 1, 16),
    (16, 1, 2, 1),
    (16, 2, 8, 3),
    (16, 1, 3, 5),
    (32, 1, 4, 2),
    (32, 2, 2, 16),
    (32, 2, 8, 1),
]


@pytest.mark.parametrize("block_size, num_kv_heads, group_size, num_splits", KERNEL_CASES)
def test_kernel_matches_reference(block_size, num_kv_heads, group_size, num_splits):
    _check_kernel(block_size, num_kv_heads, group_size, num_splits)


@pytest.mark.parametrize("merge_tile", [4, 8])
def test_last_split_merges_over_several_loads(monkeypatch, merge_tile):
    """A merge tile smaller than the used splits (7 for the 200-token row): the running max carries over."""
    monkeypatch.setattr(decode_attention, "MERGE_TILE", merge_tile)
    _check_kernel(block_size=16, num_kv_heads=2, group_size=2, num_splits=16)


def _check_kernel(block_size, num_kv_heads, group_size, num_splits):
    generator = torch.Generator().manual_seed(block_size + num_splits * 100 + group_size)
    kv = PagedKV(SEQ_LENS, block_size, num_kv_heads, HEAD_DIM, generator)
    num_heads = num_kv_heads * group_size
    q = torch.randn(len(SEQ_LENS), num_heads, HEAD_DIM, generator=generator)
    scale = HEAD_DIM**-0.5
    # Poisoned buffers: any element the kernel fails to write, or reads without writing, shows as NaN.
    out = torch.full_like(q, float("nan"))
    workspace = decode_workspace(len(SEQ_LENS), num_heads, num_kv_heads, num_splits, HEAD_DIM, q.device)
    workspace.partial_out.fill_(float("nan"))
    workspace.partial_lse.fill_(float("nan"))
    expected = paged_decode_attention_reference(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale)

    for _ in range(2):  # the second call reuses the split counts the first left behind
        paged_decode_attention(q, *kv.caches(), scale, num_splits, out=out, workspace=workspace)

        assert not out.isnan().any()
        assert _max_rel_err(out, expected) <= 1e-5
        assert (out[SEQ_LENS.index(0)] == 0).all()
        assert (workspace.arrivals == 0).all()


@pytest.mark.parametrize("num_splits", [1, 4])
def test_kernel_gives_zeros_for_an_all_padded_batch(num_splits):
    generator = torch.Generator().manual_seed(0)
    kv = PagedKV([0, 0], 16, 2, HEAD_DIM, generator)
    q = torch.randn(2, 4, HEAD_DIM, generator=generator)

    out = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.25, num_splits)

    assert out.shape == q.shape and out.dtype == q.dtype
    assert (out == 0).all()


def test_default_num_splits_fills_the_gpu_only_when_rows_are_few():
    # Pairs filling at most half the SMs get a fixed number of splits, more about 2 programs per SM.
    assert default_num_splits(batch_size=1, num_kv_heads=8, max_seq_len=40960, num_sms=132) == FEW_PAIRS_SPLITS
    assert default_num_splits(batch_size=8, num_kv_heads=8, max_seq_len=40960, num_sms=132) == FEW_PAIRS_SPLITS
    assert default_num_splits(batch_size=16, num_kv_heads=8, max_seq_len=40960, num_sms=132) == 3
    assert default_num_splits(batch_size=64, num_kv_heads=8, max_seq_len=40960, num_sms=132) == 1
    # A given programs_per_sm applies to any batch (bench_kernels sweeps it).
    assert default_num_splits(batch_size=8, num_kv_heads=8, max_seq_len=40960, num_sms=132, programs_per_sm=4) == 9
    # Never more splits than tiles in the longest row.
    assert default_num_splits(batch_size=1, num_kv_heads=8, max_seq_len=BLOCK_N + 8, num_sms=132) == 2


def test_long_rows_get_more_splits_only_where_the_rows_are_few():
    """Two programs an SM where that at least triples the default's splits: one row of eight KV heads."""
    assert long_row_splits(batch_size=1, num_kv_heads=8, max_seq_len=40960, num_sms=132) == MAX_SPLITS
    assert long_row_splits(batch_size=2, num_kv_heads=8, max_seq_len=40960, num_sms=132) is None  # 17 against 8
    assert long_row_splits(batch_size=4, num_kv_heads=8, max_seq_len=40960, num_sms=132) is None  # 9 against 8
    assert long_row_splits(batch_size=64, num_kv_heads=8, max_seq_len=40960, num_sms=132) is None
    assert long_row_splits(batch_size=1, num_kv_heads=8, max_seq_len=LONG_ROW_TOKENS, num_sms=132) is None


def _real_shape_inputs(batch, generator):
    """Qwen3-4B attention shapes: 32 query heads over 8 KV heads, head_dim 128, bf16, block 16."""
    seq_lens = torch.randint(1, 4097, (batch,), generator=generator).tolist()
    if batch > 1:
        seq_lens[-1] = 0  # a padded row
    kv = PagedKV(seq_lens, 16, 8, 128, generator, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, 32, 128, generator=generator).bfloat16().cuda()
    return q, kv


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("dependents_early", [False, True])
def test_kernel_matches_reference_on_gpu_bf16(batch, dependents_early):
    generator = torch.Generator().manual_seed(batch)
    q, kv = _real_shape_inputs(batch, generator)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    expected = paged_decode_attention_reference(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 128**-0.5)
    for num_splits in sorted({1, default_num_splits(batch, 8, 4096, num_sms), MAX_SPLITS}):
        out = paged_decode_attention(
            q,
            kv.k_cache,
            kv.v_cache,
            kv.block_tables,
            kv.seq_lens,
            128**-0.5,
            num_splits,
            dependents_early=dependents_early,
        )
        assert not out.isnan().any()
        assert _max_rel_err(out, expected) <= 1e-2, num_splits


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_replays_in_a_cuda_graph_with_new_lengths():
    generator = torch.Generator().manual_seed(0)
    batch, num_splits, scale = 8, 8, 128**-0.5
    q, kv = _real_shape_inputs(batch, generator)
    out = torch.empty_like(q)
    workspace = decode_workspace(batch, 32, 8, num_splits, 128, q.device)

    def step():
        paged_decode_attention(q, *kv.caches(), scale, num_splits, out=out, workspace=workspace)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # Shorter rows (same blocks) and a new query: the captured grid must adapt on the device.
    kv.seq_lens.copy_(kv.seq_lens // 3)
    q.copy_(torch.randn(q.shape, generator=generator).bfloat16())
    graph.replay()
    torch.cuda.synchronize()

    expected = paged_decode_attention_reference(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, scale)
    assert _max_rel_err(out, expected) <= 1e-2


@pytest.mark.parametrize(
    "head_dim, num_kv_heads, group_size, num_splits", [(24, 2, 2, 3), (24, 1, 3, 1), (40, 2, 4, 16)]
)
def test_head_dims_that_are_not_powers_of_two(head_dim, num_kv_heads, group_size, num_splits):
    """The tiny model's 24 (a padded BLOCK_D: the masked columns must stay out of the output and the partials)
    with poisoned buffers, one split or several."""
    generator = torch.Generator().manual_seed(head_dim + num_splits)
    kv = PagedKV(SEQ_LENS, 16, num_kv_heads, head_dim, generator)
    q = torch.randn(len(SEQ_LENS), num_kv_heads * group_size, head_dim, generator=generator)
    out = torch.full_like(q, float("nan"))
    workspace = decode_workspace(len(SEQ_LENS), q.shape[1], num_kv_heads, num_splits, head_dim, q.device)
    workspace.partial_out.fill_(float("nan"))
    workspace.partial_lse.fill_(float("nan"))
    paged_decode_attention(q, *kv.caches(), head_dim**-0.5, num_splits, out=out, workspace=workspace)
    assert not out.isnan().any() and (out[SEQ_LENS.index(0)] == 0).all()
    assert _max_rel_err(out, _dense_attention_float64(q, kv.dense_k, kv.dense_v, head_dim**-0.5)) <= 1e-5


@pytest.mark.parametrize("num_splits", [1, 4])
def test_kernel_survives_huge_scores(num_splits):
    """Every score shifted by 2500 (exp2 of it in log2 units overflows fp32), their differences O(1): the running
    max of each split and the merge's max keep the output finite and right."""
    generator = torch.Generator().manual_seed(num_splits)
    kv = PagedKV(SEQ_LENS, 16, 2, HEAD_DIM, generator)
    q = torch.randn(len(SEQ_LENS), 4, HEAD_DIM, generator=generator)
    q[..., 0] = 1e4
    for cache in (kv.k_cache, kv.v_cache):
        cache[..., 0] = torch.where(cache[..., 0].isnan(), cache[..., 0], 1.0)
    kv.dense_k = [k.clone().index_fill_(-1, torch.tensor([0]), 1.0) for k in kv.dense_k]
    kv.dense_v = [v.clone().index_fill_(-1, torch.tensor([0]), 1.0) for v in kv.dense_v]
    out = paged_decode_attention(q, *kv.caches(), 0.25, num_splits)
    assert out.isfinite().all()
    assert _max_rel_err(out, _dense_attention_float64(q, kv.dense_k, kv.dense_v, 0.25)) <= 2e-3
