"""The sampling tail: what a step runs on the logits after the forward (penalties, the sampler its variant picks,
the logprobs reduction, packing; prompt logprobs). It consumes logprobs, packing and requests, so it sits above
them; nothing below imports it."""

from qwen3_runtime.sampling_tail.tail import SamplingTail
from qwen3_runtime.sampling_tail.variant import Sampler, TailVariant

__all__ = ["SamplingTail", "Sampler", "TailVariant"]
