"""What every benchmark result records about where and when it was measured, and the server's own counters."""

from __future__ import annotations

import datetime
import os
import subprocess

import torch
import triton
from prometheus_client.parser import text_string_to_metric_families


def environment() -> dict:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = os.environ.get("GIT_COMMIT", "unknown")  # the device machine gets no .git
    return {
        "commit": os.environ.get("GIT_COMMIT", commit),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def unlabelled_samples(text: str) -> dict[str, float]:
    """A Prometheus text page's samples that carry no labels, by name (counters' `_total`, histograms' `_sum`
    and `_count` among them)."""
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
