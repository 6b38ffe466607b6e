"""A process's resident memory for /metrics: the engine process reports its own, the API process its own."""

from __future__ import annotations

import os


def rss_bytes() -> int:
    """This process's resident memory (Linux's /proc/self/statm; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
