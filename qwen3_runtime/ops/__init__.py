"""Device kernels (Triton) with plain PyTorch references.

On CUDA the Triton kernels run; on the CPU the references run, unless
TRITON_INTERPRET=1 is set, in which case the Triton kernels themselves run
in Triton's interpreter (this is how CI tests them).
"""

import functools
import os

import torch

TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors, for sizing grids; the CPU (references or interpreter) counts as one."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def use_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernel (rather than its reference) should run on `t`."""
    return t.is_cuda or TRITON_INTERPRET


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch options for programmatic dependent launch (Hopper and later): a kernel launched this way
    is set up while its predecessor runs, once every program of the predecessor has called
    gdc_launch_dependents(). Every kernel given these options (USE_PDL) calls gdc_wait(), which returns
    when its predecessor has finished and its writes are visible, before it touches global memory other
    than inputs the host staged before the step and weights (tests/ops/test_pdl_launch.py checks the
    PTX). Most trigger last: triggered first, the next kernels' waiting programs took SM slots early and
    a decode step got slower (H200, Qwen3-4B, batch 1: 3.44 against 3.02 ms; triggered last: 2.89). The
    exceptions are the norm, a one-wave kernel right before a projection, which triggers first, so the
    projection's programs are resident and start the moment it finishes (batch 1: 2.68 against 2.64 ms,
    measured with the attention merge kernel then doing the same), the attention inputs, so the
    attention kernel reads its rows' lengths while they run (engine wall time per step at batch 1 / 8
    / 32: 2.53 / 2.72 / 3.07 against 2.51 / 2.72 / 3.04 ms), the attention kernel, which triggers
    after its tiles, before its last split merges, or at its start when o_proj preloads its weights
    (ops/linear_preload.py), gate/up at up to 8 rows, so that down_proj requests its first weight
    tiles early (ops.linear.mlp_partials), and qkv, so that the attention inputs and the kernels they
    let launch are resident while it streams (model.py)."""
    on = not TRITON_INTERPRET and _hopper_or_later(t.device)
    return {"USE_PDL": on, **({"launch_pdl": True} if on else {})}


@functools.lru_cache
def _hopper_or_later(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
