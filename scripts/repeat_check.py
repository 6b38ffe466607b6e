"""Repeats test_graph_eager_and_host_paths_agree's workload (tests/test_runner.py) many times, to catch a
difference that shows only now and then: every run of every mode must match the first run bit for bit
(token ids and every logprob field; the host path's float64 logprobs in ids and ranks only), and the first
differing fields are printed in full. Two more modes hunt for reads of memory nothing wrote: `poison` fills
new allocations and the allocator's free blocks with NaN, `dirty` leaves random values in the free blocks.
The prefix cache is off: every run repeats the same prompts, and a cached prompt's recomputed tail takes other
products than its cold prefill (a step of other rows: cuBLAS picks its kernel by them), so its bits may
rightly differ; what is hunted is a difference between runs of the same steps.

Usage: python -m scripts.repeat_check --config qwen3-0.6b --repeats 15 --modes graph eager async host poison dirty
"""

from __future__ import annotations

import argparse
import sys

import torch

from tests.test_runner import GPU_MODES, _gpu_requests, _gpu_runtime, _run_joining

MEMORY_MODES = {"poison": "nan", "dirty": "random"}  # async runs over prepared allocator memory


def fingerprint(outputs: list, exact: bool) -> list[tuple]:
    def entry(lp):
        if lp is None:
            return None
        return (lp.token_id, lp.rank, tuple(lp.top_ids)) + ((lp.logprob, tuple(lp.top_logprobs)) if exact else ())

    def entries(lps):
        return None if lps is None else tuple(entry(lp) for lp in lps)

    return [(tuple(o.token_ids), entries(o.logprobs), entries(o.prompt_logprobs), o.error) for o in outputs]


def report_differences(label: str, first: list[tuple], got: list[tuple], limit: int = 8) -> bool:
    shown = 0
    for request, (a, b) in enumerate(zip(first, got)):
        for field, x, y in zip(("token_ids", "logprobs", "prompt_logprobs", "error"), a, b):
            if x == y:
                continue
            if not isinstance(x, tuple) or not isinstance(y, tuple) or len(x) != len(y):
                pairs = [("", x, y)]
            else:
                pairs = [(f"[{i}]", u, v) for i, (u, v) in enumerate(zip(x, y)) if u != v]
            for where, u, v in pairs[: max(0, limit - shown)]:
                print(f"  {label}: request {request} {field}{where}\n    first {u}\n    now   {v}")
                shown += 1
    return shown > 0


def fill_free_memory(fill: str) -> None:
    """Leaves the caching allocator's free blocks (small to large) holding NaN or random values."""
    blocks = [torch.empty(n, device="cuda") for n in [1 << 20] * 64 + [1 << 24] * 32 + [1 << 28] * 8]
    for block in blocks:
        if fill == "nan":
            block.fill_(float("nan"))
        else:
            block.random_()
    torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["graph", "eager", "async", "host", "poison", "dirty"],
        choices=[*GPU_MODES, *MEMORY_MODES],
    )
    args = parser.parse_args()
    first = {}  # the first run's fingerprints: exact (True) and ids only (False)
    failed = 0
    for mode in args.modes:
        if mode in MEMORY_MODES:
            torch.use_deterministic_algorithms(mode == "poison", warn_only=True)
            torch.utils.deterministic.fill_uninitialized_memory = mode == "poison"
            fill_free_memory(MEMORY_MODES[mode])
        rt = _gpu_runtime(args.config, **GPU_MODES.get(mode, GPU_MODES["async"]), **{"engine.prefix_caching": False})
        exact = mode != "host"
        differing = 0
        for repeat in range(args.repeats):
            outputs = _run_joining(rt, _gpu_requests(rt.vocab_size))
            prints = {True: fingerprint(outputs, True), False: fingerprint(outputs, False)}
            for key in (True, False) if exact else (False,):  # the host path's logprobs are float64 values
                first.setdefault(key, prints[key])
            differing += report_differences(f"{mode} run {repeat}", first[exact], prints[exact])
        print(f"{args.config} {mode}: {differing} of {args.repeats} runs differ from the first run", flush=True)
        failed += differing
        del rt
        torch.use_deterministic_algorithms(False)
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
