"""qwen3_runtime: a Qwen3 decode runtime with cheap, exact token log-probabilities."""

from qwen3_runtime.params import SamplingParams
from qwen3_runtime.request import RequestOutput
from qwen3_runtime.runtime import Runtime

__all__ = ["Runtime", "SamplingParams", "RequestOutput"]
