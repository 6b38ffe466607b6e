"""scripts/bench_constrained.py end to end on the tiny config (CPU, the kernels' PyTorch references, Qwen3's own
vocabulary, which the grammars need) at minimal sizes: constrained.json has every part's figures, finite and
positive, and each step of each batch one copy and one wait."""

import json
import math

import pytest

from qwen3_runtime import ops

pytest.importorskip("xgrammar")

from scripts import bench_constrained as bench  # noqa: E402

ARGS = ["--config", "tiny", "--set", "engine.device=cpu", "--set", "model.dtype=float32"]
ARGS += ["--concurrency", "3", "--prompt-len", "8", "--max-tokens", "4", "--repeats", "2"]


def test_every_part_writes_finite_figures(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ops, "TRITON_INTERPRET", False)  # the interpreter is slow
    result = bench.main([*ARGS, "--out", str(tmp_path)])
    assert json.loads((tmp_path / "constrained.json").read_text()) == json.loads(json.dumps(result))
    assert {"config", "commit", "gpu", "torch", "date", "schema", "batches", "compile"} <= set(result)
    assert "all constrained / none" in capsys.readouterr().out

    times = result["compile"]
    assert times["engine_setup_ms"] > 0 and times["compile_first_ms"] > times["compile_cached_ms"] >= 0

    part = result["batches"]
    assert part["concurrency"] == 3 and list(part["rows"]) == list(bench.BATCHES)
    for row in part["rows"].values():
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("tpot_ms", "others_tpot_ms", "tokens_per_s"))
        assert row["copies_per_step"] == row["syncs_per_step"] == 1
        assert 2 <= row["mean_tokens"] <= 4
    assert [row["constrained"] for row in part["rows"].values()] == [0, 1, 3]
    assert math.isfinite(part["all_vs_none_tpot"]) and math.isfinite(part["one_others_vs_none_tpot"])


def test_bad_arguments():
    with pytest.raises(SystemExit):
        bench.parse_args([*ARGS, "--concurrency", "1"])
