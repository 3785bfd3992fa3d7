"""The package layout is the architecture: spot_eval's subpackages are layers that import only
downwards, nothing imports the CLI, `spot` never imports spot_eval, lm_eval or mlflow, and no
module comes back to itself through a cycle. Read from the source with `ast`, so imports inside
functions count too."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A layer may import the layers of lower rank and itself; equal ranks may not import each other.
LAYERS = {
    "cli": 4,
    "plugin": 3.5,  # the plugin API: re-exports of what a plugin may use, the conformance checks among them
    "harness": 3,
    "reports": 2,
    "registry": 1.5,  # every method, built in or a plugin's: what reports name and colour by, and the harness builds
    "families": 1,
    "method": -1,  # how a method is described (the plugin contract's record)
    "training": 1,
    "tracking": 1,
    "execution": 1,  # it knows the benchmark problems (spot_eval.data) to judge their tests
    "checkpoints": 0,
    "data": 0,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every absolute module name an import statement in the file names (`from a import b` names a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; the project uses absolute imports"
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def project_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    raw = {module_name(p): imported(p) for package in ("spot", "spot_eval") for p in (ROOT / package).rglob("*.py")}
    graph = {}
    for module, names in raw.items():
        targets = set()
        for name in names:
            parts = name.split(".")
            while parts and ".".join(parts) not in raw:
                parts.pop()
            if parts and ".".join(parts) != module:
                targets.add(".".join(parts))
        graph[module] = targets
    return graph


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "spot_eval" and len(parts) > 1 else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        here = layer(module)
        for target in targets:
            there = layer(target)
            if here is None or there is None or there == here:
                continue
            if there == "cli" or LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports as [a, b, ..., a], or None. A package importing its own submodules is skipped."""
    edges = {m: sorted(t for t in ts if not t.startswith(m + ".")) for m, ts in graph.items()}
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target in edges.get(module, ()):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


GRAPH = project_graph()


@pytest.mark.parametrize("subpackage", sorted(set(LAYERS) - {"cli"}))
def test_every_subpackage_imports(subpackage):
    importlib.import_module(f"spot_eval.{subpackage}")


def test_every_module_sits_in_a_layer():
    loose = sorted(m for m in GRAPH if m.startswith("spot_eval.") and layer(m) not in LAYERS)
    assert not loose, f"modules outside the layers (move them into a subpackage, or add one to LAYERS): {loose}"



def test_spot_exports_what_it_lists():
    """spot's names load on first use (spot/__init__.py): each one listed must resolve, and none be left out."""
    import spot

    assert sorted(spot.__all__) == sorted(spot._HOMES)
    assert all(getattr(spot, name).__name__ == name for name in spot.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        spot.nothing  # noqa: B018

def test_the_layers_import_only_downwards():
    wrong = layer_violations(GRAPH)
    assert not wrong, "imports that climb up or sideways:\n" + "\n".join(wrong)


def test_spot_is_a_library_without_io_dependencies():
    banned = ("spot_eval", "lm_eval", "mlflow", "matplotlib", "pandas")
    wrong = sorted(
        f"{module_name(p)} -> {name}"
        for p in (ROOT / "spot").rglob("*.py")
        for name in imported(p)
        if name.split(".")[0] in banned
    )
    assert not wrong, wrong


def test_no_import_cycles():
    assert find_cycle(GRAPH) is None


def test_the_checks_catch_a_cycle_and_an_upward_import():
    """The two checks above on literal graphs, so that a broken check cannot pass silently."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"p": {"p.x"}, "p.x": {"p"}}) is None  # a package and its own submodule
    graph = {
        "spot_eval.training.collect": {"spot_eval.harness.decode", "spot_eval.checkpoints.target"},
        "spot_eval.tracking.writer": {"spot_eval.training.corpus"},
        "spot_eval.harness.lm": {"spot_eval.cli", "spot_eval.reports.results"},
    }
    assert layer_violations(graph) == [
        "spot_eval.harness.lm -> spot_eval.cli",
        "spot_eval.tracking.writer -> spot_eval.training.corpus",
        "spot_eval.training.collect -> spot_eval.harness.decode",
    ]
