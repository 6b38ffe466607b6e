"""scripts/step_timeline.py on synthetic traces: kernels named by role whatever the layer's kernels (the skinny
kernel's eight, cuBLAS's silu_mul and a reduction of its own), and deltas that add up to the step."""

import pytest

from scripts.step_timeline import critical_path, layer_roles

NORM, GEMM = "_add_rms_norm_kernel", "_skinny_gemm_kernel"
SKINNY = [NORM, GEMM, "_attention_inputs_kernel", "_decode_attention_kernel", "_preload_gemm_kernel", NORM, GEMM, GEMM]
CUBLAS = [NORM, "nvjet_a", "_attention_inputs_kernel", "_decode_attention_kernel", "nvjet_b", "reduce", NORM]
CUBLAS += ["nvjet_c", "_silu_mul_kernel", "nvjet_d"]


def test_roles_of_the_skinny_layer():
    roles = layer_roles(SKINNY)
    assert roles == ["input norm", "qkv", "attention inputs", "attention", "o_proj", "post-attention norm"] + [
        "gate/up",
        "down",
    ]


def test_roles_of_a_cublas_layer_with_kernels_of_its_own():
    assert layer_roles(CUBLAS) == [
        "input norm", "qkv", "attention inputs", "attention", "o_proj", "o_proj +", "post-attention norm",
        "gate/up", "silu_mul", "down",
    ]  # fmt: skip


MOE = SKINNY[:6] + [GEMM, "_route_kernel", "gate_up_kernel", "down_kernel"]


def test_roles_of_a_moe_layer():
    assert layer_roles(MOE)[5:] == ["post-attention norm", "router", "routing", "experts gate/up", "experts down"]


@pytest.mark.parametrize("layer", [SKINNY, CUBLAS, MOE])
def test_critical_path_adds_up(layer):
    layers, head, tail = 8, ["_embed_kernel"], [NORM, "lm_head", "_pack_kernel"]
    names = head + layer * layers + tail
    durations = [1.0] * len(head) + [1.0 + k / 10 for k in range(len(layer))] * layers + [1.0] * len(tail)
    events, t = [], 0.0
    for _ in range(4):  # steps; the first is dropped (it may be cut short)
        for name, dur in zip(names, durations):
            events.append({"cat": "kernel", "name": f"{name}(args)", "ts": t, "dur": dur})
            t += dur
        t += 5.0  # between steps
    path = critical_path(events)
    assert [role for role, _, _ in path["layer"]] == layer_roles(layer)
    assert [us for *_, us in path["layer"]] == pytest.approx([1.0 + k / 10 for k in range(len(layer))])
    assert [name for name, _ in path["tail"]] == tail
    assert path["step_us"] == pytest.approx(sum(durations))
