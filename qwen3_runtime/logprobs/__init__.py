"""Token log-probabilities: a float64 host reference and the device reduction.

Triton is imported only when the device kernels first run.
"""

from qwen3_runtime.logprobs.reduce import LogprobBuffers, reduce_logprobs
from qwen3_runtime.logprobs.reference import TokenLogprob, token_logprob_from_row

__all__ = ["LogprobBuffers", "TokenLogprob", "reduce_logprobs", "token_logprob_from_row"]
