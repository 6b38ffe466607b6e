"""Token log-probabilities: `TokenLogprob` and its float64 host reference here (NumPy only, so the API server's
process can read them without torch); the device reduction in `reduce` (torch, and Triton when its kernels first
run)."""

from qwen3_runtime.logprobs.reference import TokenLogprob, token_logprob_from_row

__all__ = ["TokenLogprob", "token_logprob_from_row"]
