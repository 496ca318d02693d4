"""The package's layers (docs/architecture.md, "Layers"): a module imports only lower layers or its own package,
so nothing imports the stages and the file-moving stages stay free of torch."""

from __future__ import annotations

import ast
import sys

from tests.conftest import REPO

SRC = REPO / "src/trainflow"
# Top-level module or package -> layer; each may import only what lies below it (or itself).
LAYERS = {
    "errors": 0,
    "torch_compat": 0,
    "atomic": 1,
    "crc": 1,
    "progress": 1,
    "records": 1,
    "tensors": 1,
    "config": 2,
    "fp8": 2,
    "hf": 3,
    "data": 4,
    "model": 4,
    "checkpoint": 4,
    "parallel": 4,
    "energy": 4,
    "stack": 4,
    "preflight": 4,
    "plan": 5,
    "export": 5,
    "train": 6,
    "gate": 6,
    "report": 7,
    "launch": 7,
    "stage": 7,
    "stages": 8,
    "status": 8,
}
MODULES = sorted(p for p in SRC.rglob("*.py"))


def imported(path) -> set[str]:
    """The top-level trainflow packages a module imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {n.split(".")[1] for n in names if n.startswith("trainflow.")}


def test_every_module_has_a_layer():
    tops = {p.relative_to(SRC).parts[0].removesuffix(".py") for p in MODULES} - {"__init__"}
    assert tops <= set(LAYERS), f"give these a layer in LAYERS and docs/architecture.md: {tops - set(LAYERS)}"


def test_modules_import_only_lower_layers():
    upward = {}
    for path in MODULES:
        top = path.relative_to(SRC).parts[0].removesuffix(".py")
        if top != "__init__" and (bad := {n for n in imported(path) if n != top and LAYERS[n] >= LAYERS[top]}):
            upward[str(path.relative_to(SRC))] = sorted(bad)
    assert not upward, f"imports of a layer not below the importer's: {upward}"


def test_no_benchmark_shadows_a_standard_module():
    """A benchmark runs with benchmarks/ first on sys.path: a file named like a standard module (tokenize.py)
    would be imported by torch in its place and break every benchmark."""
    stems = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    assert not stems & sys.stdlib_module_names
