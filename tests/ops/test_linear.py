import pytest
import torch

from qwen3_runtime.ops import linear as linear_module
from qwen3_runtime.ops.linear import Tiles, gated_linear, linear, linear_partials, mlp_partials
from qwen3_runtime.ops.norms import silu_mul, silu_mul_reference


def _close(ours: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    ref = x.double() @ weight.double().t()
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


@pytest.mark.parametrize("rows", [1, 3, 17, 40])  # 40: the wide tiles past 32 rows
@pytest.mark.parametrize("n,k", [(64, 128), (80, 200)])  # whole tiles / ragged N and K
def test_linear_matches_the_product(rows, n, k):
    gen = torch.Generator().manual_seed(rows * n)
    x, weight = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    out = linear(x, weight)
    assert out.shape == (rows, n) and out.dtype == x.dtype
    _close(out, x, weight)


@pytest.mark.parametrize("splits", [1, 2, 3])
@pytest.mark.parametrize("n,k", [(64, 512), (48, 300)])
@pytest.mark.parametrize("rows", [5, 100])  # 100: past SKINNY_MAX_ROWS, the partials' own limit
def test_partials_add_up_to_the_product(splits, n, k, rows):
    gen = torch.Generator().manual_seed(splits)
    x, weight = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    parts = linear_partials(x, weight, splits=splits)
    # K is cut into slices of whole 128-wide tiles, none empty: 512 columns in 3 slices become 2 of 256.
    assert parts.shape[1:] == (rows, n) and 1 <= parts.shape[0] <= splits and parts.dtype == torch.float32
    _close(parts.sum(0), x, weight)


@pytest.mark.parametrize("rows", [1, 3, 17, 40, 70])  # 40: the wide tiles past 32 rows; 70: 128 weight rows a tile
@pytest.mark.parametrize("n,k", [(64, 128), (40, 200)])  # whole tiles / ragged columns and K
def test_gated_linear_is_silu_of_gate_times_up(rows, n, k):
    gen = torch.Generator().manual_seed(rows + n)
    x, weight = torch.randn(rows, k, generator=gen), torch.randn(2 * n, k, generator=gen)
    out = gated_linear(x, weight)
    ref = silu_mul_reference(x.double() @ weight.double().t())
    assert out.shape == (rows, n)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


@pytest.mark.parametrize("tiles", [Tiles(128, 64, 8, 4), Tiles(256, 64, 8, 3)])  # bench_kernels' wider tiles
@pytest.mark.parametrize("gated,splits", [(False, 1), (True, 1), (False, 3)])
def test_any_tile_shape_gives_the_product(tiles, gated, splits):
    gen = torch.Generator().manual_seed(tiles.block_n + splits)
    rows, n, k = 70, 200, 320  # ragged N, K and rows
    x, weight = torch.randn(rows, k, generator=gen), torch.randn(2 * n if gated else n, k, generator=gen)
    out = torch.full((splits, rows, n) if splits > 1 else (rows, n), float("nan"))  # poisoned: unwritten shows
    linear_module._launch(x, weight, out, splits, gated=gated, tiles=tiles)
    ref = x.double() @ weight.double().t()
    ref = silu_mul_reference(ref) if gated else ref
    got = out.sum(0) if splits > 1 else out
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


@pytest.mark.parametrize("rows", [1, 9])  # down_proj launched early, and not
def test_mlp_partials_add_up_to_down_of_the_gated_product(rows):
    gen = torch.Generator().manual_seed(rows)
    x, gate_up, down = (torch.randn(shape, generator=gen) for shape in ((rows, 128), (128, 128), (80, 64)))
    ref = silu_mul_reference(x.double() @ gate_up.double().t()) @ down.double().t()
    torch.testing.assert_close(
        mlp_partials(x, gate_up, down).sum(0).double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item()
    )


def test_down_proj_launches_early_and_prefetches_up_to_mlp_early_rows(monkeypatch):
    launches = []
    monkeypatch.setattr(linear_module, "_launch", lambda *args, **kwargs: launches.append(kwargs))
    monkeypatch.setattr(linear_module, "_prefetch_tiles", lambda weight: 2)
    monkeypatch.setattr(linear_module, "num_sms", lambda device: 132)  # so down_proj splits K
    for rows in (linear_module.MLP_EARLY_ROWS, linear_module.MLP_EARLY_ROWS + 1):
        parts = mlp_partials(torch.randn(rows, 256), torch.randn(2048, 256), torch.randn(64, 1024))
        assert parts.shape[0] > 1
    mlp_partials(torch.randn(1, 256), torch.randn(2200, 256), torch.randn(64, 1100))  # K not whole tiles
    gate_up, down, gate_up_later, down_later, _, down_ragged = launches
    assert gate_up["dependents_early"] and down["prefetch_tiles"] == 1
    assert not gate_up_later["dependents_early"] and down_later["prefetch_tiles"] == 0
    assert gate_up["prefetch_tiles"] == gate_up_later["prefetch_tiles"] == 2  # after its norm, as before
    assert down_ragged["prefetch_tiles"] == 0  # its last slice's first tile would cross the row's end


def test_linear_lets_its_dependents_launch_early_only_when_asked(monkeypatch):
    launches = []
    monkeypatch.setattr(linear_module, "_launch", lambda *args, **kwargs: launches.append(kwargs))
    x, weight = torch.randn(2, 256), torch.randn(64, 256)
    linear(x, weight, dependents_early=True)  # qkv
    linear(x, weight)
    assert [launch["dependents_early"] for launch in launches] == [True, False]


@pytest.mark.parametrize("shape, tiles", [((6144, 2560), 2), ((19456, 2560), 1), ((64, 256), 2), ((64, 100), 0)])
def test_prefetch_is_about_prefetch_bytes_in_whole_tiles_inside_the_row(monkeypatch, shape, tiles):
    """Qwen3-4B's qkv and gate/up, a small weight (capped by its 2 tiles) and one shorter than a tile."""
    monkeypatch.setattr(linear_module, "pdl_launch", lambda t: {"USE_PDL": True})
    weight = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    assert linear_module._prefetch_tiles(weight) == tiles
    assert linear_module._prefetch_tiles(weight.float()) == 0


def test_larger_batches_and_empty_ones_go_to_the_library(monkeypatch):
    x, weight = torch.randn(linear_module.FUSED_MAX_ROWS + 1, 32), torch.randn(16, 32)
    monkeypatch.setattr(linear_module, "_launch", None)  # any skinny launch would fail
    wide = x[: linear_module.SKINNY_MAX_ROWS + 1]
    _close(linear(wide, weight), wide, weight)
    assert linear_partials(x, weight).shape == (1, x.shape[0], 16)
    assert linear(x[:0], weight).shape == (0, 16)
    gate_up = torch.randn(32, 32)
    ref = silu_mul_reference(x.double() @ gate_up.double().t())
    torch.testing.assert_close(gated_linear(x, gate_up).double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 32, 64, 128])
def test_bf16_projections_of_qwen3_4b_on_the_gpu(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    for n, k in [(6144, 2560), (19456, 2560), (2560, 4096), (2560, 9728)]:
        x = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
        weight = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
        ref = x.float() @ weight.float().t()
        for out in (linear(x, weight).float(), linear_partials(x, weight).sum(0)):
            assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()
        if n == 19456:  # the fused gate/up: its epilogue rounds as linear + silu_mul do
            gated = gated_linear(x, weight)
            unfused = silu_mul(linear(x, weight))
            assert (gated.float() - unfused.float()).abs().max() <= 1e-2 * unfused.float().abs().max()


@pytest.mark.parametrize("rows", [1, 33, 70])  # narrow tiles; wide ones past WIDE_ROWS; gate/up's past SKINNY_MAX_ROWS
@pytest.mark.parametrize("n,k", [(1, 1), (65, 129)])  # one column of one element; one past whole tiles
def test_every_output_is_written(monkeypatch, rows, n, k):
    """Outputs and partials start as NaN, through linear, gated_linear and linear_partials (split K)."""
    empty = torch.empty
    monkeypatch.setattr(linear_module.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    gen = torch.Generator().manual_seed(rows + n)
    x, weight = torch.randn(rows, k, generator=gen), torch.randn(2 * n, k, generator=gen)
    _close(linear(x, weight), x, weight)
    parts = linear_partials(x, weight, splits=2)
    _close(parts.sum(0), x, weight)
    ref = silu_mul_reference(x.double() @ weight.double().t())
    torch.testing.assert_close(gated_linear(x, weight).double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
