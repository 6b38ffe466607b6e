"""scripts/bench_prefill.py end to end on the tiny config (CPU, the kernels' PyTorch references, a small
vocabulary), every part at minimal sizes: prefill.json has each part's figures, finite and positive."""

import json
import math

import pytest
import torch

from qwen3_runtime import ops
from qwen3_runtime.config import load_config
from scripts import bench_prefill as bench
from scripts.floors import layer_linear_params, prefill_flops

ARGS = ["--config", "tiny", "--set", "engine.device=cpu", "--set", "model.dtype=float32"]
ARGS += ["--set", "model.architecture.vocab_size=512", "--set", "model.architecture.eos_token_id=511"]
ARGS += ["--no-hf", "--repeats", "1", "--shapes", "1x8", "2x16"]
ARGS += ["--rates", "100", "--num-requests", "4", "--prompt-range", "8", "24", "--output-range", "2", "4"]
ARGS += ["--chunk-sizes", "16", "--system-len", "32", "--questions", "3", "--question-range", "4", "8"]
ARGS += ["--answer-tokens", "2", "--prompt-len", "24"]


@pytest.fixture(autouse=True)
def _fast_cpu(monkeypatch):
    """The kernels' PyTorch references (the Triton interpreter is slow), on one thread: on a busy machine a
    second thread makes small ops stall."""
    monkeypatch.setattr(ops, "TRITON_INTERPRET", False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _positive(row: dict, *keys: str) -> None:
    for key in keys:
        assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])


def test_every_part_writes_finite_figures(tmp_path, capsys):
    result = bench.main([*ARGS, "--out", str(tmp_path)])
    assert json.loads((tmp_path / "prefill.json").read_text()) == json.loads(json.dumps(result))
    assert {"config", "commit", "gpu", "torch", "date", "shapes", "arrivals", "prefix", "prompt"} <= set(result)
    out = capsys.readouterr().out
    assert all(f"== {part}" in out for part in bench.PARTS)

    shapes = result["shapes"]
    _positive(shapes, "matmul_flops_s", "copy_bandwidth_bytes_s", "weight_bytes")
    assert [row["shape"] for row in shapes["rows"]] == ["1x8", "2x16"]
    for row in shapes["rows"]:
        _positive(row, "ms", "compute_floor_ms", "weight_floor_ms", "vs_compute_floor", "vs_weight_floor")
        assert "hf_ms" not in row

    rows = result["arrivals"]["rows"]
    assert [row["max_num_batched_tokens"] for row in rows] == [1024, 16]  # the config's, then --chunk-sizes
    for row in rows:
        _positive(
            row, "ttft_p50_ms", "itl_p50_ms", "tpot_median_ms", "offline_tpot_ms", "tpot_vs_offline", "ms_per_step"
        )
        assert row["ttft_p99_ms"] >= row["ttft_p50_ms"] and row["itl_max_ms"] >= row["itl_p99_ms"]
        assert row["decode_batch_median"] >= 1 and row["requests"] == 4

    prefix = result["prefix"]
    _positive(prefix, "first_ttft_ms", "hit_ttft_ms", "miss_ttft_ms", "hit_vs_miss", "hit_rate")
    assert prefix["hit_rate"] < 1 and len(prefix["ttft_ms_on"]) == len(prefix["ttft_ms_off"]) == 3

    prompt = result["prompt"]
    _positive(prompt, "plain_ms", "prompt_logprobs_ms", "lm_head_ms", "read_ms")
    assert math.isfinite(prompt["extra_vs_lm_head"])  # a difference of two medians: noise may make it negative


def test_prefill_flops_counts_layers_lm_head_and_causal_keys():
    arch = load_config("tiny").model.architecture
    per_token = 2 * layer_linear_params(arch)
    lm_head = 2 * arch.hidden_size * arch.vocab_size
    per_key = arch.num_hidden_layers * 4 * arch.num_attention_heads * arch.head_dim
    # Prompts of 3 and 1 tokens: 4 tokens, 2 sampled positions, 3 + 2 + 1 + 1 keys attended.
    assert prefill_flops(arch, [3, 1]) == 4 * per_token + 2 * lm_head + 7 * per_key
    assert prefill_flops(arch, [3], logits_rows=2) == 3 * per_token + 2 * lm_head + 6 * per_key


def test_quick_and_bad_arguments():
    args = bench.parse_args([*ARGS, "--quick", "--num-requests", "100", "--chunk-sizes", "512", "1024"])
    assert (args.repeats, args.num_requests, args.chunk_sizes) == (3, 40, [512])
    with pytest.raises(SystemExit):
        bench.parse_args([*ARGS, "--output-range", "1", "4"])


def test_arrivals_through_the_server(tmp_path, monkeypatch):
    """--server sends each rate's requests again through a real `qwen3-runtime serve` child: its figures join the
    API's rows."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the child runs the kernels' references, as here
    result = bench.main([*ARGS, "--parts", "arrivals", "--chunk-sizes", "--server", "--out", str(tmp_path)])
    (row,) = result["arrivals"]["rows"]  # the config's chunk size alone
    _positive(row, *(f"server_{name}_ms" for name, _, _ in bench.SERVED), "server_tpot_vs_offline")
    _positive(row, "ms_per_step", "server_ms_per_step")
    assert row["server_itl_max_ms"] >= row["server_itl_p99_ms"] >= row["server_itl_p50_ms"]
    assert row["server_ttft_p99_ms"] >= row["server_ttft_p50_ms"]
    assert (tmp_path / f"server_{row['max_num_batched_tokens']}.log").stat().st_size > 0
