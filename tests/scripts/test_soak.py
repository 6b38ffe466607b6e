"""scripts/soak against a real server on the tiny config (CPU) with a small KV cache, so bursts of long prompts
outgrow it: the short CI version of issue 38's soak. Every check must pass (the script exits 0)."""

import json
import os
import subprocess
import sys

from qwen3_runtime import ops
from scripts.soak.__main__ import main as soak_main
from tests.server.conftest import ROOT, start_server

KV_BLOCKS = "engine.num_kv_blocks=32"  # 512 tokens: two requests near max_model_len (256) fill it


def test_soak_passes(tmp_path, monkeypatch, capsys):
    proc, url = start_server("--set", KV_BLOCKS)
    try:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the server's kernels
        out = tmp_path / "soak.json"
        cmd = [sys.executable, "-m", "scripts.soak", "--url", url, "--set", KV_BLOCKS, "--requests", "100"]
        cmd += ["--concurrency", "8", "--max-tokens", "4", "--burst-every", "40", "--burst-size", "4"]
        cmd += ["--deadline", "120", "--replay-max", "30", "--replay-group", "8", "--out", str(out)]
        run = subprocess.run(cmd + ["--save", str(tmp_path / "load.pkl")], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    # The same checks from the saved load, with no server (a soak split over two sittings). In this process, so
    # as not to import and build everything again; on the kernels' PyTorch references, as the first sitting.
    again = tmp_path / "again.json"
    args = cmd[3:]  # after `python -m scripts.soak`
    args[args.index(str(out))] = str(again)
    monkeypatch.setattr(ops, "TRITON_INTERPRET", False)
    assert soak_main(args + ["--replay-from", str(tmp_path / "load.pkl")]) == 0, capsys.readouterr().out[-6000:]
    assert json.loads(again.read_text())["checks"] == json.loads(out.read_text())["checks"]
    assert figures["requests"] >= 100
    assert figures["leaks"]["kv_blocks_free"] == figures["leaks"]["kv_blocks_total"] == 32
    assert "preemptions" in figures["leaks"]  # reported; the CI version's 4-token outputs rarely preempt
    kinds = " ".join(figures["by_kind"])
    for kind in ("bad", "disconnect", "abort", "chat+stream", "completions+whole"):
        assert kind in kinds, kinds
