import pytest
import torch

from qwen3_runtime.ops.linear_preload import MAX_ROWS, preload_applies, preload_plan, preloaded_partials

hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs a Hopper GPU"
)


@pytest.mark.parametrize(
    "n,k,sms", [(2560, 4096, 132), (1024, 2048, 132), (200, 384, 132), (96, 1000, 132), (5120, 5120, 132), (64, 128, 1)]
)
def test_the_plan_covers_k_with_at_most_one_program_per_sm(n, k, sms):
    splits, per_slice = preload_plan(n, k, sms)
    k_tiles, column_tiles = -(-k // 128), -(-n // 64)
    assert (splits - 1) * per_slice < k_tiles <= splits * per_slice  # no empty slice, none missing
    assert column_tiles * splits <= max(sms, column_tiles)


def test_not_used_off_hopper_or_beyond_its_rows():
    weight = torch.zeros(64, 128, dtype=torch.bfloat16)
    assert not preload_applies(1, weight)  # the CPU
    if torch.cuda.is_available():
        assert not preload_applies(MAX_ROWS + 1, weight.cuda())
        assert not preload_applies(1, weight.float().cuda())


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
def test_partials_add_up_to_the_product_on_the_gpu(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    # Qwen3-4B's and Qwen3-0.6B's o_proj, and ragged N and K (TMA fills past the edges with zeros).
    for n, k in [(2560, 4096), (1024, 2048), (200, 384), (96, 1000)]:
        x = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
        weight = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
        assert preload_applies(rows, weight)
        splits, _ = preload_plan(n, k, torch.cuda.get_device_properties(0).multi_processor_count)
        poison = torch.full((splits, rows, n), float("nan"), device="cuda")
        del poison  # the allocator hands its block to the kernel's output: unwritten elements stay NaN
        parts = preloaded_partials(x, weight)
        assert parts.shape == (splits, rows, n) and not parts.isnan().any()
        ref = x.double() @ weight.double().t()
        torch.testing.assert_close(parts.double().sum(0), ref, rtol=0, atol=1e-4 * ref.abs().max().item())
