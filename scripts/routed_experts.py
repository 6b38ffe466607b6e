"""How many distinct experts a MoE model's decode steps route to, counted on the device: what a step must read of
its experts (floors.routed_weight_bytes), which depends on the batch (one row: k experts per layer; 64 rows: most of
them).

A separate eager runtime (the same config and seed, so the same weights, prompts and tokens as the timed one) counts
them: layers/moe.py's `route` is wrapped to mark each forward's expert ids in a [layers, experts + 1] table on the
device (the last column takes padded rows' id), read after each decode step. In a captured graph the marking would
cost time; eagerly it runs beside the same routing."""

from __future__ import annotations

import statistics

import numpy as np
import torch

from qwen3_runtime import Runtime, SamplingParams
from qwen3_runtime.layers import moe


class RoutingProbe:
    """While open, every forward's routing marks the experts it picks, its sparse layers in order."""

    def __init__(self, rt: Runtime) -> None:
        blocks = [m for m in rt.model.modules() if isinstance(m, moe.SparseMoeBlock)]
        self.layers, self.num_experts = len(blocks), blocks[0].experts.num_experts
        self.hits = torch.zeros(self.layers, self.num_experts + 1, dtype=torch.int32, device=rt.device)
        self.calls, self._route = 0, moe.route
        moe.route = self._marking_route

    def _marking_route(self, *args, **kwargs):
        expert_ids, weights = self._route(*args, **kwargs)
        self.hits[self.calls % self.layers].index_fill_(0, expert_ids.flatten().long(), 1)
        self.calls += 1
        return expert_ids, weights

    def take(self) -> int:
        """Distinct experts routed to since the last take, summed over the sparse layers."""
        routed = int(self.hits[:, : self.num_experts].sum())
        self.hits.zero_()
        return routed

    def close(self) -> None:
        moe.route = self._route


def routed_experts(config: str, batches: list[int], prompt_len: int, steps: int, max_num_seqs: int) -> dict[int, float]:
    """batch -> the median over `steps` decode steps of the distinct experts routed to (all sparse layers), for
    bench_decode's random prompts (seeds as measure_tpot's first repetition)."""
    rt = Runtime.from_yaml(
        config,
        overrides={
            "engine.max_model_len": max(1024, prompt_len + steps + 8),
            "engine.max_num_seqs": max_num_seqs,
            "engine.cuda_graphs": False,
            "engine.async_scheduling": False,
        },
    )
    probe = RoutingProbe(rt)
    counts = {}
    try:
        for batch in batches:
            prompts = np.random.default_rng(0).integers(0, rt.vocab_size, (batch, prompt_len)).tolist()
            for prompt in prompts:
                rt.add_request(prompt, SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True))
            while rt.scheduler.waiting or rt.num_generated < batch:  # the prompts' steps
                rt.step()
            probe.take()
            routed = []
            while rt.has_unfinished():
                rt.step()
                routed.append(probe.take())
            counts[batch] = statistics.median(routed[:-1] or routed)  # the last step may have retired rows
    finally:
        probe.close()
        rt.close()
    return counts
