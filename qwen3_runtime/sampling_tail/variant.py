"""Which sampling tail a batch takes. Each variant runs in decode graphs of its own, so a batch pays only for the
passes its rows need."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from qwen3_runtime.params import SamplingParams
from qwen3_runtime.request import Request

TOP_K_CAP = 64  # the largest top-k the select path samples among without a sort


class Sampler(str, Enum):  # StrEnum once Python 3.10 is dropped
    """How a batch draws its tokens: greedy batches draw no noise; random rows asking for top-k (at most TOP_K_CAP)
    or top-p select what they keep without a sort; only a batch with a larger top-k, or a row asking top-p alone
    whose processed logprobs need the cutoff itself, sorts."""

    GREEDY = "greedy"
    RANDOM = "random"
    SELECT = "select"
    SORT = "sort"


class TailVariant(NamedTuple):
    """What the tail compiles differently. Every field multiplies the decode graphs: add one only for a pass that
    costs when unused."""

    sampler: Sampler
    penalized: bool  # the penalties / logit_bias / min_tokens pass over the logits, and the counts after it
    masked: bool = False  # structured outputs' grammar mask (a row of the batch is constrained)

    @classmethod
    def of(cls, reqs: Sequence[Request], logprobs_mode: str) -> TailVariant:
        """The cheapest variant that serves every row of the batch."""
        params = [req.params for req in reqs]
        random = [p for p in params if not p.greedy]
        filtered = [p for p in random if p.top_k > 0 or p.top_p < 1]
        # A row writing its processed logits needs its top-p cutoff, which only the sort gives without a top-k.
        if any(p.top_k > TOP_K_CAP or (p.top_k <= 0 and writes_processed(p, logprobs_mode)) for p in filtered):
            sampler = Sampler.SORT
        else:
            sampler = Sampler.SELECT if filtered else Sampler.RANDOM if random else Sampler.GREEDY
        return cls(sampler, any(p.penalized for p in params), any(req.constrained for req in reqs))

    @staticmethod
    def every() -> list[TailVariant]:
        """All variants, in the order their graphs are captured (kept, so the captures share their pool as before;
        the masked ones last)."""
        return [
            TailVariant(sampler, penalized, masked)
            for masked in (False, True)
            for sampler in Sampler
            for penalized in (False, True)
        ]


def writes_processed(params: SamplingParams, logprobs_mode: str) -> bool:
    """Whether the step writes the row's processed logits over its raw ones, for logprobs of what was sampled."""
    return params.logprobs is not None and (params.logprobs_mode or logprobs_mode) == "processed"
