"""qwen3_runtime: a Qwen3 decode runtime with cheap, exact token log-probabilities."""

from qwen3_runtime.params import SamplingParams
from qwen3_runtime.runtime import Runtime
from qwen3_runtime.sequence import RequestOutput

__all__ = ["Runtime", "SamplingParams", "RequestOutput"]
