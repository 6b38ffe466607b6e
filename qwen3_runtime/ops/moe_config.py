"""Tile configurations of the expert kernels (ops/fused_moe.py): which way a program finds its rows and the tile
shape, per kernel, expert count, token count and GPU.

Tuned configurations are JSON files in `moe_configs/` (written by scripts/tune_moe.py), one per kernel shape and
GPU, named by `config_file_name`: {"<tokens>": {MoeConfig's fields}, ...}. A call takes the entry of the smallest
token count at least its own, so a captured graph's bucket always gets the same one. Past a file's largest count
(a file tuned at decode sizes leaves prefills untuned), without a file, and always on the CPU, `default_config`
decides.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import NamedTuple

import torch

CONFIG_DIR = Path(__file__).with_name("moe_configs")
# Up to this many (token, expert) pairs the default finds each expert's rows by scanning the routing table.
SCAN_MAX_PAIRS = 512


class MoeConfig(NamedTuple):
    """sorted: rows grouped by expert beforehand (large token counts), else each program scans the routing table
    for its expert's rows (decode). block_n counts weight rows: gate and up rows together for gate/up.
    group_m: on the sorted path, row blocks that run next to each other over all column tiles (L2 reuse)."""

    sorted: bool
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 1


# engine.batch_invariant: one configuration and one path for every token count, so a token's bits do not depend
# on the call's other tokens; sized for the prefills that dominate that mode's time.
INVARIANT_CONFIG = MoeConfig(sorted=True, block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3, group_m=8)


def default_config(tokens: int, top_k: int) -> MoeConfig:
    """Scan at decode sizes: a 16-row tile holds an expert's rows, narrow column tiles fill the GPU and long K-tiles
    keep the weight loads wide. Grouped 64-row tiles above, whose weight tiles serve more rows each."""
    if tokens * top_k <= SCAN_MAX_PAIRS:
        return MoeConfig(sorted=False, block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)
    return MoeConfig(sorted=True, block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3, group_m=8)


def device_name(device: torch.device) -> str:
    """The GPU's name as file names carry it: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    return re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name(device)).strip("_")


def config_file_name(num_experts: int, n: int, k: int, top_k: int, dtype: torch.dtype, device: str) -> str:
    """n: the kernel's weight rows per expert (2 I for gate/up, H for down), k: its reduction length (H, I)."""
    return f"E={num_experts},N={n},K={k},top_k={top_k},dtype={str(dtype).removeprefix('torch.')},device={device}.json"


def tuned_config(path: Path, tokens: int) -> MoeConfig | None:
    """The file's entry for `tokens` tokens (that of the smallest count at least `tokens`); None without a file or
    past its largest count."""
    if not path.is_file():
        return None
    entries = sorted((int(at), MoeConfig(**fields)) for at, fields in json.loads(path.read_text()).items())
    return next((config for at, config in entries if at >= tokens), None)


def lookup(weight: torch.Tensor, tokens: int, top_k: int, invariant: bool = False) -> MoeConfig:
    """The configuration for a kernel over `weight` [E, N, K] at `tokens` tokens."""
    if invariant:
        return INVARIANT_CONFIG
    if not weight.is_cuda:
        return default_config(tokens, top_k)
    return _tuned_or_default(tuple(weight.shape), top_k, weight.dtype, weight.device, tokens)


@functools.lru_cache(maxsize=4096)  # once per shape and token count: eager steps call it per layer
def _tuned_or_default(
    shape: tuple[int, int, int], top_k: int, dtype: torch.dtype, device: torch.device, tokens: int
) -> MoeConfig:
    path = CONFIG_DIR / config_file_name(*shape, top_k, dtype, device_name(device))
    return tuned_config(path, tokens) or default_config(tokens, top_k)
