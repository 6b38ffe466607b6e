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


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0 (triton.cdiv without importing triton)."""
    return -(-a // b)


def use_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernel (rather than its reference) should run on `t`."""
    return t.is_cuda or TRITON_INTERPRET


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch options for programmatic dependent launch (Hopper and later): a kernel launched this way
    is set up while its predecessor runs, once every program of the predecessor has called
    gdc_launch_dependents(). Every kernel given these options (USE_PDL) calls gdc_wait(), which returns
    when its predecessor has finished and its writes are visible, before it touches global memory other
    than inputs the host staged before the step and weights (tests/ops/test_pdl_launch.py checks the
    PTX).

    Most kernels trigger last: triggered first, the next kernels' waiting programs take SM slots early
    and the step gets slower. The exceptions trigger early because the next kernel uses the time: the
    norm (one wave before a projection, whose programs are then resident and start as it finishes); the
    attention inputs (attention reads its rows' lengths meanwhile); the attention kernel (after its
    tiles, before its last split merges, or at its start when o_proj preloads its weights,
    ops/linear_preload.py); gate/up at up to 8 rows (down_proj requests its first weight tiles early,
    ops.linear.mlp_partials); and qkv (the attention inputs and the kernels they let launch are resident
    while it streams, layers/attention.py)."""
    on = not TRITON_INTERPRET and _hopper_or_later(t.device)
    return {"USE_PDL": on, **({"launch_pdl": True} if on else {})}


@functools.lru_cache
def _hopper_or_later(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
