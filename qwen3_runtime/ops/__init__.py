"""Device kernels (Triton) with plain PyTorch references.

On CUDA the Triton kernels run; on the CPU the references run, unless
TRITON_INTERPRET=1 is set, in which case the Triton kernels themselves run
in Triton's interpreter (this is how CI tests them).
"""
import functools
import os

import torch

TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors, for sizing grids; the CPU (references or interpreter) counts as one."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def use_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernel (rather than its reference) should run on `t`."""
    return t.is_cuda or TRITON_INTERPRET
