"""Where a step's packed results (packing.py) land: `latest`, one device buffer every step writes (and the next
step reads its sampled tokens from, with async scheduling), snapshotted on the step's stream into one of two
device buffers in turn, each copied into pinned host memory on its own stream, so the next step neither queues
behind the copy nor overwrites results that are still being copied or not read yet. One `latest` lets a CUDA
graph serve every step whichever buffer its results go to."""

from __future__ import annotations

import numpy as np
import torch

from qwen3_runtime.stats import RunnerStats


class StepOutputs:
    def __init__(self, max_rows: int, width: int, device: torch.device, stats: RunnerStats) -> None:
        pinned = device.type == "cuda"
        self.latest = torch.zeros(max_rows, width, dtype=torch.int32, device=device)
        self.packed = torch.zeros(2, max_rows, width, dtype=torch.int32, device=device)
        self.host = torch.zeros_like(self.packed, device="cpu", pin_memory=pinned)
        self.stats = stats
        self._buffer = 0
        self._unread = [False, False]
        self._copy_stream = torch.cuda.Stream(device) if pinned else None
        self._copied = [torch.cuda.Event() for _ in range(2)] if pinned else None

    def copy_out(self, num_rows: int) -> int:
        """The step's `latest` rows into the buffer the step before did not use, then its one device-to-host copy,
        queued on the copy stream; returns the buffer. Its last results, those of the step two before, must have
        been read by now."""
        if self._unread[self._buffer ^ 1]:
            raise RuntimeError("a step was launched before the results of the step two before it were read")
        self._buffer = buffer = self._buffer ^ 1
        self._unread[buffer] = True
        source, target = self.packed[buffer, :num_rows], self.host[buffer, :num_rows]
        source.copy_(self.latest[:num_rows])  # on the step's stream: before the next step overwrites latest
        if self._copy_stream is None:
            target.copy_(source)
            return buffer
        self._copy_stream.wait_stream(torch.cuda.current_stream(self.packed.device))
        with torch.cuda.stream(self._copy_stream):
            target.copy_(source, non_blocking=True)
            self._copied[buffer].record()
        return buffer

    def wait(self, buffer: int, num_rows: int) -> np.ndarray:
        """The step's one synchronisation: its copy has landed (a step after it may still run). Returns
        a view of the pinned rows, which the step after next overwrites."""
        if self._copied is not None:
            self._copied[buffer].synchronize()
        self._unread[buffer] = False
        self.stats.count_copy(num_rows * self.packed.shape[-1] * self.packed.element_size(), synced=True)
        return self.host[buffer, :num_rows].numpy()
