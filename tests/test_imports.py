"""What importing a module loads: the CLI (for --help and --version) and the API server's process import neither
torch nor Triton; the Runtime's process alone does. And the package's parts import one another in layers."""

import ast
import subprocess
import sys
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "qwen3_runtime"


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


def test_a_structured_output_constraint_is_built_without_torch_or_xgrammar():
    """The API process checks constraints (structured/spec.py); only the engine compiles them."""
    assert not loaded_after_import("qwen3_runtime.structured.spec") & {"torch", "triton", "xgrammar"}


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


def test_no_import_cycle_between_the_package_parts():
    """Each top-level module or subpackage of qwen3_runtime is a part; an import from one part into another is an
    edge, lazy ones included (they run too), those under TYPE_CHECKING not. The parts must form layers: a cycle
    means one of them cannot be understood, tested or moved without the others."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        graph.setdefault(part, set()).update(set(imported_parts(ast.parse(path.read_text()))) - {part})
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        cycle = " imports ".join(reversed(e.args[1]))  # graphlib lists each part before the parts importing it
        pytest.fail(f"import cycle between parts of qwen3_runtime: {cycle}")


def imported_parts(node: ast.AST) -> Iterator[str]:
    """The parts of qwen3_runtime that the imports under `node` load ('__init__': a name of the package itself)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
            continue  # for annotations alone: never runs
        if isinstance(child, ast.Import):
            yield from (part for alias in child.names if (part := _part(alias.name.split("."))))
        elif isinstance(child, ast.ImportFrom) and child.module == "qwen3_runtime":
            for alias in child.names:  # a module of the package, or a name its __init__ defines
                is_part = (PACKAGE / alias.name).is_dir() or (PACKAGE / f"{alias.name}.py").is_file()
                yield alias.name if is_part else "__init__"
        elif isinstance(child, ast.ImportFrom) and child.module:
            yield from filter(None, [_part(child.module.split("."))])
        yield from imported_parts(child)


def _part(dotted: list[str]) -> str | None:
    return (dotted[1] if len(dotted) > 1 else "__init__") if dotted[0] == "qwen3_runtime" else None


def test_a_runtime_that_never_sees_a_constraint_never_loads_xgrammar():
    """xgrammar is needed only by constrained requests: a step of unconstrained ones does not import it."""
    code = (
        "import sys; from qwen3_runtime import Runtime, SamplingParams; "
        "rt = Runtime.from_yaml('tiny', {'model.dtype': 'float32', 'engine.device': 'cpu'}); "
        "rt.generate([[1, 2, 3]], SamplingParams(max_tokens=2)); rt.close(); "
        "print('xgrammar' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.split()[-1] == "False"
