"""What importing a module loads: the CLI (for --help and --version) and the API server's process import neither
torch nor Triton; the Runtime's process alone does."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def loaded_after_import(module: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after importing `module`."""
    code = f"import sys, {module}; print(' '.join(sorted({{name.partition('.')[0] for name in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(result.stdout.split())


@pytest.mark.parametrize(
    "module",
    [
        "qwen3_runtime",
        "qwen3_runtime.cli",
        "qwen3_runtime.server.protocol",
        "qwen3_runtime.server.openai_api",
        "qwen3_runtime.server.launch",  # what `serve` runs in the API process, the engine client included
        "qwen3_runtime.models.registry",  # the families' model classes are imported on first use
        "qwen3_runtime.models.hf_config",
    ],
)
def test_the_cli_and_the_api_process_import_neither_torch_nor_triton(module):
    assert not loaded_after_import(module) & {"torch", "triton"}


def test_the_runtime_still_brings_them():
    assert {"torch", "triton"} <= loaded_after_import("qwen3_runtime.runtime")


def test_the_package_names_resolve_when_first_read():
    import qwen3_runtime
    from qwen3_runtime import RequestOutput, Runtime, SamplingParams
    from qwen3_runtime.params import SamplingParams as defined
    from qwen3_runtime.request import RequestOutput as output_defined
    from qwen3_runtime.runtime import Runtime as runtime_defined

    assert (Runtime, SamplingParams, RequestOutput) == (runtime_defined, defined, output_defined)
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        qwen3_runtime.Missing  # noqa: B018
