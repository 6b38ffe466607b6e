"""A decode step's critical path, kernel by kernel: how far each kernel's end moves past the end of the
kernel before it (torch.profiler over CUDA-graph replays, the median over replays), averaged over the
middle layers. Kernels launched early (programmatic dependent launch) overlap, so their profiled
durations do not add up; these deltas do, to the step's time. The JSON also gives each kernel's start
against the previous kernel's end ("layer_starts", negative where it launched early): how early a
dependent kernel got resident.

Usage: python -m scripts.step_timeline --config qwen3-4b --batch 1 8 32 --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from qwen3_runtime import Runtime
from scripts.profiling import GREEDY_GRAPH, finish_batch, profiled_runtime, start_batch, trace_events
from scripts.report import environment

# Kernels known by name; the rest are projections, named by the kernel they follow (cuBLAS may add one of its own
# to a projection, e.g. a split-K reduction: that one takes the projection's name and a "+").
NAMED = {
    "_attention_inputs_kernel": "attention inputs",
    "_decode_attention_kernel": "attention",
    "_silu_mul_kernel": "silu_mul",  # gate/up's SiLU where cuBLAS, not the skinny kernel, takes gate/up
    "_route_kernel": "routing",  # a MoE layer: the router's product, routing, then the experts' two kernels
    "gate_up_kernel": "experts gate/up",
    "down_kernel": "experts down",
}
FOLLOWING = {
    "input norm": ("qkv",),
    "attention": ("o_proj",),
    "post-attention norm": ("gate/up", "down"),
    "silu_mul": ("down",),
}


def critical_path(events: list[dict]) -> dict:
    """Per kernel of a layer, the mean of (its end - the previous kernel's end) over the middle layers, and
    the same for the kernels before the first layer's norm (head) and after the last layer (tail)."""
    events = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    starts = [i for i, e in enumerate(events) if e["name"].startswith("_embed_kernel")]
    steps = [events[a:b] for a, b in zip(starts[1:], starts[2:] + [len(events)])]  # the first may be cut short
    steps = [s for s in steps if len(s) == len(steps[0])]
    names = [e["name"].split("(")[0][:40] for e in steps[0]]
    deltas = np.median([_end_deltas(s) for s in steps], axis=0)
    leads = np.median([_start_leads(s) for s in steps], axis=0)
    norms = [i for i, name in enumerate(names) if name == "_add_rms_norm_kernel"]  # two a layer, then the final
    first, layers, period = norms[0], (len(norms) - 1) // 2, norms[2] - norms[0]
    roles = layer_roles(names[first : first + period])
    middle = [slice(first + period * i, first + period * (i + 1)) for i in range(2, layers - 2)]
    last = first + period * layers
    layer = np.mean([deltas[m] for m in middle], axis=0)
    layer_starts = np.mean([leads[m] for m in middle], axis=0)
    return {
        "layer": [[role, names[first + k], float(layer[k])] for k, role in enumerate(roles)],
        "layer_starts": [[role, float(layer_starts[k])] for k, role in enumerate(roles)],
        "head": [[names[i], float(deltas[i])] for i in range(first)],
        "tail": [[names[i], float(deltas[i])] for i in range(last, len(names))],
        "step_us": float(np.median([_ends(s)[-1] - s[0]["ts"] for s in steps])),
    }


def layer_roles(names: list[str]) -> list[str]:
    """A layer's kernels (their names, from the input norm on) by role."""
    roles, norms, following = [], iter(("input norm", "post-attention norm")), ()
    sparse = "_route_kernel" in names  # after its post-attention norm, the router's product
    for name in names:
        role = next(norms) if name == "_add_rms_norm_kernel" else NAMED.get(name)
        if role is None:
            role, following = (following[0], following[1:]) if following else (roles[-1] + " +", ())
        else:
            following = ("router",) if sparse and role == "post-attention norm" else FOLLOWING.get(role, ())
        roles.append(role)
    return roles


def _ends(step: list[dict]) -> np.ndarray:
    return np.array([e["ts"] + e["dur"] for e in step])


def _end_deltas(step: list[dict]) -> np.ndarray:
    return np.concatenate([[step[0]["dur"]], np.diff(_ends(step))])


def _start_leads(step: list[dict]) -> np.ndarray:
    """Each kernel's start minus the previous kernel's end (0 for the first)."""
    return np.concatenate([[0.0], np.array([e["ts"] for e in step[1:]]) - _ends(step)[:-1]])


def timeline(rt: Runtime, batch: int, prompt_len: int, decode_steps: int) -> dict:
    start_batch(rt, batch, prompt_len, decode_steps)  # decode_steps: the context the profile sees
    graphs = rt.runner.graphs
    for _ in range(3):
        graphs.run(batch, GREEDY_GRAPH)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(6):
            graphs.run(batch, GREEDY_GRAPH)
        torch.cuda.synchronize()
    finish_batch(rt)
    return {"batch": batch, "context": prompt_len + decode_steps, **critical_path(trace_events(prof))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-4b")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode-steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    rt = profiled_runtime(args.config, args.batch)
    rows = []
    for batch in args.batch:
        row = timeline(rt, batch, args.prompt_len, args.decode_steps)
        rows.append(row)
        layer = sum(us for *_, us in row["layer"])
        print(
            f"batch {batch}: step {row['step_us']:.1f} us, a middle layer {layer:.2f} us: "
            + ", ".join(f"{role} ({kernel}) {us:.2f}" for role, kernel, us in row["layer"]),
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timeline.json").write_text(
        json.dumps({"config": args.config, "rows": rows, **environment()}, indent=1)
    )


if __name__ == "__main__":
    main()
