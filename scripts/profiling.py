"""An independent count of what crosses to the host: torch.profiler's trace of engine steps."""

from __future__ import annotations

import json
import tempfile

import numpy as np
from torch.profiler import ProfilerActivity, profile, record_function

from qwen3_runtime import Runtime, SamplingParams
from qwen3_runtime.runner import GraphVariant
from qwen3_runtime.sampling_tail import Sampler, TailVariant

# The runtime waits on its stream; the profiler's own exit is a cudaDeviceSynchronize, not counted.
_SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize")
# The decode graph start_batch's batches run (greedy, no penalties, no long row): what the profiles replay.
GREEDY_GRAPH = GraphVariant(TailVariant(Sampler.GREEDY, penalized=False), long_rows=False)


def trace_events(prof: profile) -> list[dict]:
    """The events of a finished torch.profiler run, through its Chrome trace."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return json.load(open(f.name))["traceEvents"]


def profiled_runtime(config: str, batches: list[int]) -> Runtime:
    """The runtime profile_decode and step_timeline measure: the same engine limits for both, so their
    figures describe the same captured step (the split count follows max_model_len)."""
    return Runtime.from_yaml(config, overrides={"engine.max_model_len": 1024, "engine.max_num_seqs": max(batches)})


def start_batch(rt: Runtime, batch: int, prompt_len: int, decode_steps: int, logprobs: int | None = None) -> None:
    """`batch` random greedy prompts (seeded by the batch size) prefilled, then `decode_steps` decode steps:
    a running batch to profile. `finish_batch` ends it."""
    for prompt in np.random.default_rng(batch).integers(0, rt.vocab_size, (batch, prompt_len)).tolist():
        rt.add_request(prompt, SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True, logprobs=logprobs))
    while rt.scheduler.waiting:
        rt.step()
    for _ in range(decode_steps):
        rt.step()


def finish_batch(rt: Runtime) -> None:
    for req in list(rt.scheduler.running):
        rt.scheduler.finish(req)


def profile_steps(rt: Runtime, steps: int) -> tuple[list[int], int]:
    """Bytes of every device-to-host copy and the number of host synchronisations that torch.profiler
    records over `steps` engine steps. One more step runs first inside the profile and is not
    counted: the profiler's start-up can miss that step's first events. A copy counts for the step
    whose host call issued it (its runtime call, by correlation id), not by when the GPU ran it: with
    async scheduling the GPU runs a step's copy while the host is already in the next step."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps + 1):
            with record_function(f"engine_step_{i}"):
                rt.step()
    trace = trace_events(prof)
    start = next(e["ts"] for e in trace if e.get("name") == "engine_step_1")
    issued_at = {
        e["args"]["correlation"]: e["ts"]
        for e in trace
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    copies = [
        e["args"].get("bytes", -1)
        for e in trace
        if e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"] and issued_at[e["args"]["correlation"]] >= start
    ]
    syncs = sum(e.get("name") in _SYNCS and e["ts"] >= start for e in trace)
    return copies, syncs
