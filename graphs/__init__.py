"""CUDA-graph capture and replay of a step function over static buffers (model-agnostic)."""

from graphs.capture import StepGraphs, default_buckets, token_buckets

__all__ = ["StepGraphs", "default_buckets", "token_buckets"]
