"""How checkpoint tensor names reach the layers: each layer that fuses or renames says so itself (its
checkpoint_routes), so the loader holds no name table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn


class WeightError(ValueError):
    """A checkpoint tensor that does not fit its parameter; the loader adds the tensor's name and file."""


@dataclass(frozen=True)
class Route:
    """Where one checkpoint tensor goes: `target`'s parameter `suffix`, or the fused `part` of it, of `expert` for
    experts stacked in one parameter. A target with load_weight(suffix, tensor, part, expert) places it itself (as
    vLLM's per-parameter weight loaders: a shard will be one more argument); else it is the parameter, whole."""

    target: nn.Module
    suffix: str
    part: int | None = None
    expert: int | None = None

    def load(self, tensor: torch.Tensor) -> None:
        load_weight = getattr(self.target, "load_weight", None)
        if load_weight is not None:
            load_weight(self.suffix, tensor, self.part, self.expert)
        else:
            copy_checked(getattr(self.target, self.suffix).data, tensor)


def routes(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, Route]]:
    """Every checkpoint tensor name under `module` and its route: a module with checkpoint_routes() answers for
    its subtree; otherwise each of its own parameters is a tensor of that name (a tied one too), and its children
    recurse."""
    if hasattr(module, "checkpoint_routes"):
        for name, route in module.checkpoint_routes():
            yield prefix + name, route
        return
    for name, _ in module.named_parameters(recurse=False, remove_duplicate=False):
        yield prefix + name, Route(module, name)
    for name, child in module.named_children():
        yield from routes(child, f"{prefix}{name}.")


def part_routes(weight: nn.Module, hf_name: str, part: int) -> Iterator[tuple[str, Route]]:
    """The tensors of checkpoint projection `hf_name`, fused as `part` of `weight` (a LinearWeight)."""
    for suffix in weight.suffixes:
        yield f"{hf_name}.{suffix}", Route(weight, suffix, part)


def copy_checked(dest: torch.Tensor, tensor: torch.Tensor) -> None:
    """A 16- or 32-bit float tensor into `dest`, cast to its dtype."""
    check_shape(dest, tensor)
    check_float(tensor)
    dest.copy_(tensor)


def check_shape(dest: torch.Tensor, tensor: torch.Tensor) -> None:
    if tuple(tensor.shape) != tuple(dest.shape):
        raise WeightError(f"has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")


def check_float(tensor: torch.Tensor) -> None:
    """Refuse what copy_ would cast without a word: an integer, or an 8-bit float, which only an FP8 projection reads
    (with its scales: layers/fp8.py)."""
    if not tensor.is_floating_point() or tensor.dtype.itemsize < 2:
        raise WeightError(
            f"has dtype {tensor.dtype}, expected a 16- or 32-bit float (8-bit weights load only where config.json's "
            "quantization_config declares FP8 projections, outside its modules_to_not_convert)"
        )
