"""Evaluation, `vcloud predict` and the viewer read a stage's predictor without importing training;
no import of the package goes round in a circle or back up a layer (issue 26, outcome 5)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import vcloud

READERS = (
    "vcloud.evaluation.predict",
    "vcloud.evaluation.evaluate",
    "vcloud.evaluation.protocols",
    "vcloud.export.viewer",
    "vcloud.pipeline",
    "vcloud.weights",
)


@pytest.mark.parametrize("module", READERS)
def test_reading_a_stage_imports_no_training(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('vcloud.train')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"{module} imports {out.strip()}"


def test_the_builders_still_name_what_moved():
    from vcloud import pipeline, weights
    from vcloud.train import checkpoint, stages

    assert stages.RefinerPipeline is pipeline.RefinerPipeline and stages.load_frozen is weights.load_frozen
    assert checkpoint.load_checkpoint is weights.load_checkpoint


# --- the static import graph: module-level imports and those inside functions alike -----------

PACKAGE = Path(vcloud.__file__).parent
# Layers that must not be reached, transitively, from a module under the prefix on the left.
# (`vcloud predict` is vcloud.apply; the registry names builders as strings, resolved on demand.)
FORBIDDEN = {
    "vcloud.evaluation": ("vcloud.train", "vcloud.runtime", "vcloud.cli"),
    "vcloud.apply": ("vcloud.train", "vcloud.runtime", "vcloud.cli"),
    "vcloud.export.viewer": ("vcloud.train",),
    "vcloud.pipeline": ("vcloud.train",),
    "vcloud.weights": ("vcloud.train",),
    "vcloud.models": ("vcloud.train", "vcloud.evaluation"),
    # The cluster layer (profiles, doctor, bill, sites) and the command line sit on top: nothing
    # that trains, evaluates, predicts or reads data reaches up into them.
    "vcloud.train": ("vcloud.runtime", "vcloud.cli"),
    "vcloud.data": ("vcloud.runtime", "vcloud.cli", "vcloud.train"),
    "vcloud.environment": ("vcloud.runtime", "vcloud.cli", "vcloud.train"),
}


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """vcloud module -> the vcloud modules it imports anywhere in its source."""
    names = _module_names()

    def known(name: str) -> str | None:  # vcloud.data.store.open_store -> vcloud.data.store
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in names.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                base = ".".join(filter(None, [base, node.module]))
                targets |= {f"{base}.{alias.name}" for alias in node.names} | {base}
        graph[module] = {found for name in targets if (found := known(name)) and found != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per back edge found by a depth-first walk, each as [a, b, ..., a]."""
    cycles, state, path = [], {}, []

    def walk(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return cycles


def _route(graph: dict[str, set[str]], start: str, goal: tuple[str, ...]) -> list[str] | None:
    """The shortest import chain from `start` to a module under one of the `goal` prefixes."""
    routes, todo = {start: [start]}, [start]
    for module in todo:
        for target in sorted(graph[module]):
            if target not in routes:
                routes[target] = [*routes[module], target]
                if target.startswith(goal):
                    return routes[target]
                todo.append(target)
    return None


def test_the_import_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "vcloud.data.store" in graph["vcloud.data.shards"]  # module level
    assert "vcloud.evaluation.fixed_protocol" in graph["vcloud.cli.data"]  # inside run_fixed_protocol
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_goes_round_in_a_circle():
    cycles = _cycles(import_graph())
    assert not cycles, "import circles (move the shared piece into the lower module):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_no_import_runs_back_up_a_layer():
    graph = import_graph()
    upward = [
        " -> ".join(route)
        for module in sorted(graph)
        for prefix, forbidden in FORBIDDEN.items()
        if module == prefix or module.startswith(prefix + ".")
        if (route := _route(graph, module, forbidden))
    ]
    assert not upward, "imports back up a layer (evaluation above train above models):\n" + "\n".join(upward)
