"""The host path, kept as a live reference and a benchmark baseline: each requesting row's full logits
copied to the host and scanned in float64, as engines usually compute logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen3_runtime.config import LogprobsConfig
from qwen3_runtime.logprobs.reference import TokenLogprob, token_logprob_from_row
from qwen3_runtime.stats import RunnerStats

# Device-path width when max_logprobs is -1 (whole-vocabulary requests take the host path).
DEFAULT_K_MAX = 20


@dataclass(frozen=True)
class LogprobsRouting:
    """Which path computes a request's logprobs: the device reduction up to `k_max` top entries, or the
    host path (by config, for k = -1, the whole vocabulary, and for k above k_max, which only
    max_logprobs: -1 allows)."""

    path: str
    k_max: int

    @classmethod
    def from_config(cls, config: LogprobsConfig) -> LogprobsRouting:
        return cls(config.path, config.max_logprobs if config.max_logprobs >= 0 else DEFAULT_K_MAX)

    def on_host(self, k: int | None) -> bool:
        return k is not None and (self.path == "host" or k == -1 or k > self.k_max)


def full_row_logprob(row: torch.Tensor, token: int, k: int, stats: RunnerStats) -> TokenLogprob | None:
    """None for a row that is not finite: its request is failed by the caller."""
    host_row = row.cpu()
    stats.count_copy(host_row.numel() * host_row.element_size(), synced=True)
    try:
        return token_logprob_from_row(host_row, token, k)
    except ValueError:
        return None
