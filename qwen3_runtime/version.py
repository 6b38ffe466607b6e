"""The installed package's version (the CLI's --version, the server's /version)."""

from __future__ import annotations

import importlib.metadata


def package_version() -> str:
    try:
        return importlib.metadata.version("qwen3_runtime")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(version unknown: not installed)"
