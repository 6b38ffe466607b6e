"""What every layer is built with: one object that a weight format or a shard placement can join, reaching each
layer without a change to the model's code."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from qwen3_runtime.quantization import WeightFormat
from qwen3_runtime.typed_config import ConfigError


@dataclass(frozen=True)
class LayerBuild:
    dtype: torch.dtype  # of the parameters as they are created: nothing is cast after (FP8 weights: of the rest)
    weights: WeightFormat = WeightFormat()  # which projections are FP8
    prefix: str = ""  # the checkpoint name of the module being built, with its dot: the formats go by names

    def at(self, name: str) -> LayerBuild:
        """The build of the child module `name`."""
        return dataclasses.replace(self, prefix=f"{self.prefix}{name}.")

    def fp8(self, *names: str) -> bool:
        """Whether the checkpoint projections `names` (under this prefix), which one parameter holds (a fused
        projection's parts, a layer's experts), are FP8: all or none, as vLLM requires of a fused projection."""
        fp8 = [self.weights.fp8(self.prefix + name) for name in names]
        if any(fp8) and not all(fp8):
            kept, converted = (self.prefix + next(n for n, f in zip(names, fp8) if f == v) for v in (False, True))
            raise ConfigError(
                f"modules_to_not_convert in {self.weights.declared_by} keeps {kept} in 16 bits but not {converted}, "
                "which one tensor holds with it: its entries must cover all of them or none"
            )
        return fp8[0]


def parameter(build: LayerBuild, *shape: int, dtype: torch.dtype | None = None) -> torch.nn.Parameter:
    """An uninitialized parameter (on the current device: meta while the model is built), in the build's dtype
    unless given."""
    return torch.nn.Parameter(torch.empty(*shape, dtype=dtype or build.dtype))
