"""The rule every kernel launched with programmatic dependent launch (ops.pdl_launch) must keep: wait for
the previous kernel before touching global memory. A kernel may start while its predecessor still runs
(earlier still when the predecessor lets its dependents launch early), so a load before the wait can
read a value not yet written: a race that no CPU test sees and a GPU test sees only sometimes. The
exceptions are an input the host staged before the step and weights (no kernel writes them), listed
below. Checked here in the PTX each kernel compiles to for sm_90, with no GPU (the compiler, not the
device)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("pdl_probe.py")
# The only reads allowed before the wait: inputs the host staged before the step and weights, which no
# kernel writes.
# The row's sequence length and its first tile's block ids (8 loads a thread, the probe's 32-token tile).
BEFORE_WAIT = {
    "_decode_attention_kernel": ["ld.global"] * 9,
    # its weight rows' first K-tiles requested into L2 (one bulk prefetch a thread)
    "_skinny_gemm_kernel": ["cp.async.bulk.prefetch.L2"],
    # its weight (one load a thread in the probe's 64 columns)
    "_add_rms_norm_kernel": ["ld.global"],
    # the row's slot and position, the head's norm weight (two halves) and its cos and sin
    "_attention_inputs_kernel": ["ld.global"] * 6,
    # its 8 weight tiles (128 x 1024 in the probe) by TMA; the input's tiles come after the wait
    "_preload_gemm_kernel": ["cp.async.bulk.tensor.2d"] * 8,
}
EXPECTED = {
    "_skinny_gemm_kernel",
    "_preload_gemm_kernel",
    "_chunk_max_kernel",
    "row_max_kernel",
    "_chunk_kernel",
    "_add_rms_norm_kernel",
    "_silu_mul_kernel",
    "_attention_inputs_kernel",
    "_decode_attention_kernel",
    "chunk_stats_kernel",
    "finish_rows_kernel",
    "_route_kernel",
    "gate_up_kernel",
    "down_kernel",
    "quantize_groups_kernel",
    "w8a8_kernel",
}


@pytest.fixture(scope="module")
def report() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_pdl_kernel_was_compiled(report):
    assert {r["kernel"] for r in report} == EXPECTED


def test_every_pdl_kernel_waits_before_its_first_global_access(report):
    for r in report:
        assert r["wait"] >= 0, f"{r['kernel']} never waits for the previous kernel"
        allowed = BEFORE_WAIT.get(r["kernel"], [])  # instruction prefixes (their suffixes vary with triton)
        assert len(r["before_wait"]) == len(allowed) and all(
            access.startswith(prefix) for access, prefix in zip(r["before_wait"], allowed)
        ), f"{r['kernel']}: {r['before_wait']} before griddepcontrol.wait"
