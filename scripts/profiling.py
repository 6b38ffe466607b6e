"""An independent count of what crosses to the host: torch.profiler's trace of engine steps."""
from __future__ import annotations

import json
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from qwen3_runtime import Runtime


def profile_steps(rt: Runtime, steps: int) -> tuple[list[int], int]:
    """Bytes of every device-to-host copy and the number of host synchronisations that torch.profiler
    records over `steps` engine steps."""
    # One warm-up step first: the profiler's start-up must not swallow the first step's events.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=0, warmup=1, active=steps), acc_events=True) as prof:
        for _ in range(steps + 1):
            rt.step()
            torch.cuda.synchronize()
            prof.step()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))["traceEvents"]
    copies = [e["args"].get("bytes", -1) for e in trace if e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"]]
    syncs = sum(e.get("name") in ("cudaStreamSynchronize", "cudaEventSynchronize") for e in trace)
    return copies, syncs  # torch.cuda.synchronize() above is a cudaDeviceSynchronize: not counted
