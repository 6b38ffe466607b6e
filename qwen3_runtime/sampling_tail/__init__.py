"""The sampling tail: what a step runs on the logits after the forward (which variant a batch takes, prompt
logprobs). It consumes logprobs, packing and requests, so it sits above them; nothing below imports it."""

from qwen3_runtime.sampling_tail.variant import Sampler, TailVariant

__all__ = ["Sampler", "TailVariant"]
