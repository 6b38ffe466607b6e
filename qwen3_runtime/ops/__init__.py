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


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch options for programmatic dependent launch (Hopper and later): a kernel launched this way
    is set up while its predecessor's last programs finish, instead of after. Every kernel given these
    options (USE_PDL) calls gdc_wait() before it reads anything and gdc_launch_dependents() last:
    triggered first instead, the next kernels' waiting programs took SM slots early and a decode step
    got slower (H200, Qwen3-4B, batch 1: 3.44 against 3.02 ms; triggered last: 2.89)."""
    on = not TRITON_INTERPRET and _hopper_or_later(t.device)
    return {"USE_PDL": on, **({"launch_pdl": True} if on else {})}


@functools.lru_cache
def _hopper_or_later(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
