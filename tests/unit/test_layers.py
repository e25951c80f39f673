"""Evaluation, `vcloud predict` and the viewer read a stage's predictor without importing training;
no import of the package goes round in a circle or back up a layer (issue 26, outcome 5): every
module sits in a layer of docs/ARCHITECTURE.md ("Layers") and imports, lazily or not, from its own
layer and the layers above it only, but for the exceptions that page names below its list."""

from __future__ import annotations

import ast
import re
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
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"
# The layers of docs/ARCHITECTURE.md, top first: a module imports from its own layer and those
# above it. "vcloud" is the package's own __init__.py (its version). The registry names builders
# and predictors as strings, imported on demand (importlib: not an import of the source).
LAYERS = (
    ("foundations", ("vcloud", "vcloud.constants", "vcloud.bands", "vcloud.errors", "vcloud.io", "vcloud.environment")),
    ("stage registry", ("vcloud.registry",)),
    ("run paths", ("vcloud.paths",)),
    ("configuration", ("vcloud.config",)),
    ("data", ("vcloud.data",)),
    ("models", ("vcloud.models",)),
    ("wind scan orders", ("vcloud.wind",)),
    ("predictors", ("vcloud.pipeline", "vcloud.weights")),
    ("training", ("vcloud.train",)),
    ("evaluation", ("vcloud.evaluation",)),
    ("apply", ("vcloud.apply",)),
    ("export", ("vcloud.export",)),
    ("runtime", ("vcloud.runtime",)),
    ("workflow logic", ("vcloud.workflow",)),
    ("entry", ("vcloud.cli", "vcloud.reference")),
)
# Imports down the list that the page names below it: a module under the prefix on the left may
# import these modules (stage validation: the metrics and the natural-cloud protocols' samples).
EXCEPTIONS = {
    "vcloud.train": ("vcloud.evaluation.metrics", "vcloud.evaluation.protocols", "vcloud.evaluation.uncrtaints"),
}
# Layers that must not be reached, transitively, from a module under the prefix on the left: the
# exceptions above included. (`vcloud predict` is vcloud.apply.)
FORBIDDEN = {
    "vcloud.evaluation": ("vcloud.train", "vcloud.runtime", "vcloud.cli"),
    "vcloud.apply": ("vcloud.train", "vcloud.runtime", "vcloud.cli"),
    "vcloud.export.viewer": ("vcloud.train",),
    "vcloud.pipeline": ("vcloud.train",),
    "vcloud.weights": ("vcloud.train",),
    "vcloud.models": ("vcloud.train", "vcloud.evaluation", "vcloud.data"),
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


def under(module: str, prefix: str) -> bool:
    """The module is `prefix` or inside it; the bare package is itself only."""
    return module == prefix or (prefix != "vcloud" and module.startswith(prefix + "."))


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer that holds `module`, None outside them all."""
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(under(module, prefix) for prefix in prefixes):
            return index
    return None


def test_every_module_of_the_package_sits_in_a_layer():
    outside = sorted(module for module in import_graph() if layer_of(module) is None)
    assert not outside, f"modules in no layer of docs/ARCHITECTURE.md (add them to its list and LAYERS): {outside}"


def test_each_layer_imports_only_from_itself_and_the_layers_above_it():
    graph = import_graph()
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
        for module in sorted(graph)
        for target in sorted(graph[module])
        if layer_of(target) > layer_of(module)
        if not any(under(module, prefix) and target in allowed for prefix, allowed in EXCEPTIONS.items())
    ]
    assert not upward, "imports back up the layers of docs/ARCHITECTURE.md (move the piece down):\n" + "\n".join(upward)


def test_an_import_back_up_a_layer_is_found_inside_a_function(tmp_path, monkeypatch):
    """The layer check sees lazy imports: a configuration module reaching for the workflow logic."""
    package = tmp_path / "vcloud"
    (package / "config").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "config" / "__init__.py").write_text("")
    (package / "config" / "late.py").write_text("def f():\n    from vcloud.workflow import run_paths\n")
    (package / "workflow.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    graph = import_graph()
    assert graph["vcloud.config.late"] == {"vcloud.workflow"}
    assert layer_of("vcloud.workflow") > layer_of("vcloud.config.late")


# --- the page and the test say the same ------------------------------------------------------


def _doc_table(heading: str) -> list[list[str]]:
    """The rows of the first table under `heading` in docs/ARCHITECTURE.md, as cells."""
    text = ARCHITECTURE.read_text()
    section = text[text.index(heading) :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows and not line.startswith("|"):
            break
    return rows[1:]  # without the header


def _module(name: str) -> str:
    """`config/` -> vcloud.config, `export/viewer.py` -> vcloud.export.viewer, `__init__.py` -> vcloud."""
    parts = name.removesuffix("/").removesuffix(".py").split("/")
    return ".".join(["vcloud", *[part for part in parts if part != "__init__"]])


def test_the_layer_list_of_the_architecture_page_is_the_tests():
    rows = _doc_table("## Layers")
    page = [(row[0], tuple(_module(name) for name in re.findall(r"`([^`]+)`", row[1]))) for row in rows]
    assert page == [(name, prefixes) for name, prefixes in LAYERS]
    exceptions = re.split(r"\.\s", ARCHITECTURE.read_text().split("Exceptions to the order:", 1)[1], maxsplit=1)[0]
    named = {_module(name) for name in re.findall(r"`([^`]+\.py)`", exceptions)}
    assert named == {target for targets in EXCEPTIONS.values() for target in targets}


def test_the_forbidden_routes_of_the_architecture_page_are_the_tests():
    page = {
        (_module(source), _module(target))
        for row in _doc_table("### What may import what")
        for source in re.findall(r"`([^`]+)`", row[0])
        for target in re.findall(r"`([^`]+)`", row[1])
    }
    assert page == {(source, target) for source, targets in FORBIDDEN.items() for target in targets}
