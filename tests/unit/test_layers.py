"""The package's layers (docs/architecture.md, "Layers"): a module imports only lower layers or its own package,
so nothing imports the stages and the file-moving stages stay free of torch."""

from __future__ import annotations

import ast
import sys

from tests.conftest import REPO
from tests.support import LAYERS

SRC = REPO / "src/trainflow"
MODULES = sorted(p for p in SRC.rglob("*.py"))
TORCH = ("model", "parallel", "fp8", "tensors", "torch_compat")
"""The packages whose modules import torch (fp8: most of them)."""
TORCH_FREE = {
    "config": "config/ runs where the DAG is built and in every stage, the torch-free ones too",
    "hf": "hf/ reads and writes Hugging Face's format without importing torch (it writes the caller's tensors)",
    "preflight": "the pre-flight checks run in every stage, the torch-free ones too",
    "energy": "account_energy starts without torch",
    "plan": "the planner runs when the DAG is built, without torch: it counts with config.shape",
    "resilience": "the records and policies of failures are torch-free: trainflow.status and the stage read them",
    "campaign": "what a campaign is and allows is torch-free: the DAG's build and trainflow.status read it",
    "status": "trainflow.status reads a run folder without torch",
}
"""The packages the design keeps free of torch, each with why."""
FORBIDDEN = {
    ("launch", "train"): "the launcher starts and judges jobs from what ranks write (records below both), never from "
    "the training loop's modules, which a launcher process has no use for",
    ("launch", "model"): "the launcher starts and judges jobs from what ranks write, never from the model they train",
    ("launch", "data"): "the launcher starts and judges jobs from what ranks write, never from the tokens they read",
    ("gate", "checkpoint"): "the gate judges nodes and collectives with tensors of its own: it never reads the run's "
    "checkpoints",
    ("gate", "data"): "the gate judges nodes and collectives with tensors of its own: it never reads the run's tokens",
    ("export", "model"): "the export streams a checkpoint's tensors by name, one shard at a time, never building the "
    "model (a 70B one would not fit one process)",
    ("export", "parallel"): "the export is one process without a process group: DCP reassembles the shards, no mesh",
    **{
        (free, torch_package): f"{why}; {torch_package} imports torch"
        for free, why in TORCH_FREE.items()
        for torch_package in TORCH
        if LAYERS[torch_package] < LAYERS[free]
    },
    **{
        ("stage", torch_package): "every stage imports stage.py, the torch-free ones too"
        for torch_package in (*TORCH, "checkpoint", "train")
    },
}
"""Arrows the layers allow but the design does not, each with why. An arrow between two packages of one layer needs
no entry: test_modules_import_only_lower_layers refuses every one (model -> parallel among them: the model stays
single-device, test_the_model_is_single_device)."""
NAMES = {".".join(("trainflow", *p.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__") for p in MODULES}


def imports(path) -> set[str]:
    """The trainflow modules a module imports, wherever in the file (module level, in a function, under
    TYPE_CHECKING): `from trainflow.x import y` names trainflow.x.y where that is a module, else trainflow.x."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainflow"):
            names |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in NAMES else node.module for a in node.names
            }
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("trainflow")}
    return names


def imported(path) -> set[str]:
    """The top-level trainflow packages a module imports."""
    return {n.split(".")[1] for n in imports(path) if "." in n}


def module_name(path) -> str:
    """trainflow/config/__init__.py -> trainflow.config, trainflow/config/hashing.py -> trainflow.config.hashing."""
    parts = ("trainflow", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import cycle (a -> b -> a) for each strongly connected group of modules in `graph` (Tarjan's)."""
    order, low, stack, found = {}, {}, [], []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = set(stack[stack.index(v) :])
            del stack[stack.index(v) :]
            if len(group) > 1:
                found.append(cycle_through(min(group), graph, group))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def cycle_through(start: str, graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside one strongly connected group."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} lies on no cycle of {sorted(group)}")


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


def test_no_import_cycles():
    """No module imports, however indirectly, one that imports it (a lazy or TYPE_CHECKING import counts: it only
    hides the circle). The finder itself first, on a graph with one."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c", "a"]]
    graph = {module_name(path): imports(path) for path in MODULES}
    found = cycles({m: names & graph.keys() - {m} for m, names in graph.items()})
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_forbidden_arrow():
    """Arrows the layers allow but the design does not: each with why."""
    found = {}
    for path in MODULES:
        top = path.relative_to(SRC).parts[0].removesuffix(".py")
        file = str(path.relative_to(SRC))
        for to in imported(path):
            if (top, to) in FORBIDDEN:
                found[f"{file} -> {to}"] = FORBIDDEN[top, to]
    assert not found, f"forbidden imports: {found}"


def test_every_forbidden_arrow_is_one_the_layers_allow():
    """An arrow the layers refuse already would be an entry no import could ever reach."""
    refused = sorted(f"{a} -> {b}" for a, b in FORBIDDEN if LAYERS[b] >= LAYERS[a])
    assert not refused, f"arrows test_modules_import_only_lower_layers refuses already: {refused}"


def test_the_model_is_single_device():
    """model.py is plain single-device PyTorch (docs/architecture.md): parallelism is applied to it afterwards
    (parallel.parallelize_model), so it imports neither the parallel layer (the layers refuse that) nor
    torch.distributed, which no layer rule sees."""
    found = []
    for node in ast.walk(ast.parse((SRC / "model.py").read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        found += [n for n in names if n == "torch.distributed" or n.startswith("torch.distributed.")]
    assert not found, f"model.py imports {found}: parallelism belongs in parallel/'s apply_* functions"


def test_no_test_module_imports_another():
    """What two test modules share lives in tests/support.py (or, a fixture, in a conftest.py): a test module that
    imports another runs, and reruns, the other's module-level code and tests wherever it is imported."""
    found = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        names |= {
            f"{n.module}.{a.name}"
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module
            for a in n.names
        }
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        if bad := sorted(n for n in names if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")):
            found[str(path.relative_to(REPO))] = bad
    assert not found, f"test modules importing test modules (move what they share to tests/support.py): {found}"


def test_configuration_its_pre_flight_checks_and_resilience_import_no_torch():
    """config/, hf/ and preflight.py run where the DAG is built and in every stage, the torch-free ones too, and
    resilience/ and campaign/ are read by trainflow.status and the stage: no import of torch anywhere in their files
    (in a function either), so none creeps in behind a lazy import. hf/write.py names torch's Tensor for its
    annotations alone, under TYPE_CHECKING."""
    files = [*(SRC / "config").glob("*.py"), SRC / "preflight.py", *(SRC / "hf").glob("*.py")]
    files += [*(SRC / "resilience").glob("*.py"), *(SRC / "campaign").glob("*.py")]
    found = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if bad := [n for n in names if n.split(".")[0] == "torch"]:
                found.setdefault(str(path.relative_to(SRC)), []).extend(bad)
    assert found == {"hf/write.py": ["torch"]}, f"torch imported: {found}"
