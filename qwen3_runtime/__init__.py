"""qwen3_runtime: a Qwen3 decode runtime with cheap, exact token log-probabilities."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwen3_runtime.params import SamplingParams
    from qwen3_runtime.request import RequestOutput
    from qwen3_runtime.runtime import Runtime

__all__ = ["Runtime", "SamplingParams", "RequestOutput"]

# Each public name's module, imported when the name is first read: importing any submodule runs this file, and the
# CLI's --help and the API server's process must not load torch and Triton with the Runtime.
_MODULES = {
    "Runtime": "qwen3_runtime.runtime",
    "SamplingParams": "qwen3_runtime.params",
    "RequestOutput": "qwen3_runtime.request",
}


def __getattr__(name: str) -> object:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
