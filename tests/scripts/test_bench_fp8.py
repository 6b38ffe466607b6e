"""scripts/bench_fp8.py: on a machine without a GPU it says so and exits cleanly; its parts run end to end on tiny
shapes on the CPU (fp32, the kernels in the interpreter, timing stubbed), every figure finite."""

import math

import pytest
import torch

from qwen3_runtime.ops.fp8_linear import W8A8Tiles
from scripts import bench_fp8 as bench


def test_without_a_gpu_it_measures_nothing_and_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path)]) is None
    assert "no CUDA GPU" in capsys.readouterr().out and not (tmp_path / "fp8.json").exists()


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "DTYPE", torch.float32)
    monkeypatch.setattr(bench, "SHAPES", [("qkv", 128, 128), ("o_proj", 128, 128), ("gate_up", 256, 128)])
    monkeypatch.setattr(bench, "MOE", dict(num_experts=8, hidden=64, inter=128, top_k=2))
    monkeypatch.setattr(bench, "ROTATE_BYTES", 1)
    monkeypatch.setattr(bench, "TILE_SWEEP", [W8A8Tiles(16, 32, 32, group_m=2)])
    monkeypatch.setattr(bench, "graph_us_per_call", lambda step, inputs: (step(inputs[0]), 1.0)[1])


def _finite(row, *keys):
    for key in keys:
        assert math.isfinite(row[key]) and row[key] > 0, (key, row)


def test_every_part_on_tiny_shapes(tiny, monkeypatch):
    rows = bench.projection_rows([1, 130], bandwidth=1e9)
    assert [(r["shape"], r["rows"]) for r in rows] == [(s, n) for s in ("qkv", "o_proj", "gate_up") for n in (1, 130)]
    for row in rows:
        _finite(row, "bf16_us", "fp8_us", "w8a8_us", "w8a8_gemm_us", "fp8_floor_us", "fp8_gb_s", "fp8_tflops")
        assert ("weight_only_us" in row) == (row["rows"] == 1)
        assert "scaled_mm_us" in row or row["scaled_mm_error"]
    for row in bench.moe_rows([1, 3], bandwidth=1e9):
        _finite(row, "bf16_us", "fp8_us", "fp8_floor_us", "experts_read")
    monkeypatch.setattr(bench, "SHAPES", bench.SHAPES[:1])
    assert len(bench.tile_rows([1, 130])) == 1  # the rows past the skinny kernel's
