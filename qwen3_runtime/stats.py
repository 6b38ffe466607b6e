"""What the runner counts at its copy and sync points."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class RunnerStats:
    """capture_s: the graph capture's wall time (Triton compilation included where the kernel cache is
    cold), which grows with a graph per bucket and variant."""

    decode_steps: int = 0
    prefill_steps: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0
    host_syncs: int = 0
    capture_s: float = 0.0

    def count_copy(self, nbytes: int, synced: bool) -> None:
        """One device-to-host copy of `nbytes`; `synced`: the host waited for it."""
        self.d2h_copies += 1
        self.d2h_bytes += nbytes
        self.host_syncs += synced

    def reset(self) -> None:
        """Back to zero (after steps that served no request: the memory profile's)."""
        for f in fields(self):
            setattr(self, f.name, f.default)
