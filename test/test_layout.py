"""The package's shape: imports run one way, no import cycles, kernels' reference
and Triton leaves never import each other, no module grows past 400 lines.

Read from the source with ``ast`` (nothing is imported), so a lazy import inside
a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flide_ext"

# A module may import from its own package and from packages of a lower rank
# (docs/architecture.md). "" is the package root (flide_ext/__init__.py).
RANKS = {
    "version": 0,
    "kernels": 1,
    "plan": 2,
    "protocol": 3,
    "layers": 3,
    "models": 4,
    "assets": 5,
    "runtime": 6,
    "server": 7,
    "entrypoints": 8,
    "": 9,
}
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every flide_ext module ``name`` imports (a ``from X import y`` of a
    submodule ``y`` counts as importing ``X.y``)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [(module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in targets:
            if module != "flide_ext" and not module.startswith("flide_ext."):
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
            if subs:
                found.update(subs)
            if not names or len(subs) < len(names):
                found.add(module)
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _package(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_rank():
    assert {_package(name) for name in MODULES} <= set(RANKS)


def _upward(graph: dict) -> list[str]:
    out = []
    for name, targets in graph.items():
        for target in targets:
            if target not in MODULES:
                out.append(f"{name} imports {target}, which does not exist")
                continue
            mine, theirs = _package(name), _package(target)
            if mine != theirs and RANKS[theirs] >= RANKS[mine]:
                out.append(f"{name} ({mine or 'root'}) imports {target} ({theirs or 'root'})")
    return out


def _cycles(graph: dict) -> list[str]:
    # Iterative depth-first search; a node met again while still on the path
    # closes a cycle.
    colour = dict.fromkeys(graph, 0)
    cycles = []
    for start in graph:
        if colour[start]:
            continue
        stack, path = [(start, iter(sorted(graph[start])))], [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                cycles.append(" -> ".join(path[path.index(child):] + [child]))
            elif colour.get(child) == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return cycles


def test_imports_run_one_way():
    upward = _upward(GRAPH)
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    cycles = _cycles(GRAPH)
    assert not cycles, "\n".join(cycles)


def _kernel_ops() -> list[str]:
    return sorted(p.name for p in (PACKAGE / "kernels").iterdir() if (p / "__init__.py").exists())


@pytest.mark.parametrize("op", _kernel_ops())
def test_kernel_leaves_are_one_way(op):
    """Per op: the public module imports its leaves; the reference and the Triton
    modules never import each other nor the public module; no kernel imports the
    planner or anything above it."""
    base = f"flide_ext.kernels.{op}"
    leaves = {name for name in MODULES if name.startswith(base + ".")}
    reference = f"{base}.reference"
    assert reference in leaves and leaves - {reference}, f"{op} needs a reference leaf and a Triton module"
    for leaf in leaves:
        targets = GRAPH[leaf]
        assert base not in targets, f"{leaf} imports its public module"
        if leaf == reference:
            assert not targets & (leaves - {f"{base}.chunks"}), f"the reference imports {targets & leaves}"
        else:
            assert reference not in targets, f"{leaf} imports the reference"
    for name, targets in GRAPH.items():
        if name.startswith("flide_ext.kernels"):
            assert not {t for t in targets if not t.startswith("flide_ext.kernels")}, name


def test_the_checks_find_what_they_look_for(tmp_path):
    """The import reader sees relative, absolute, lazy and submodule imports; an
    upward import and a cycle are reported."""
    source = tmp_path / "probe.py"
    source.write_text("from ..plan import tree\nimport flide_ext.kernels.dispatch\n"
                      "def f():\n    from ..protocol.errors import RequestError\n")
    found = _imports("flide_ext.runtime.probe", source)
    assert found == {"flide_ext.plan.tree", "flide_ext.kernels.dispatch", "flide_ext.protocol.errors"}
    assert _upward({"flide_ext.kernels.tables": {"flide_ext.plan.flat"}}) == [
        "flide_ext.kernels.tables (kernels) imports flide_ext.plan.flat (plan)"]
    assert _upward({"flide_ext.runtime.engine": {"flide_ext.plan.flat", "flide_ext.runtime.rounds"}}) == []
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(ring) == ["a -> b -> c -> a"]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_modules_stay_small():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
