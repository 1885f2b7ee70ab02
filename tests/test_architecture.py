"""The package layout's rules (docs/DESIGN.md), checked on the source.

Every `import` / `from ... import` of a gateway module counts: at module
level, under `if TYPE_CHECKING:`, and inside functions. `from pkg import
name` is an edge to `pkg.name` when that is a module, else to `pkg` (its
`__init__`, whose re-exports are edges of their own).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gateway"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        source = _absolute(module, node)
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            yield sub if sub in MODULES else source


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = {t for node in ast.walk(tree) for t in _targets(module, node)}
    return {t for t in found if t in MODULES and t != module}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (first module repeated at the end) through each group of
    modules that import one another (strongly connected component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(graph[node]):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            group = {stack.pop()}
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module (breadth-first)."""
    start = min(group)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        step: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    step.append(child)
        frontier = step
    raise AssertionError(f"no cycle in {sorted(group)}")


def _outside(prefix: str, allowed: tuple[str, ...]) -> list[str]:
    def inside(target: str) -> bool:
        return any(target == a or target.startswith(a + ".") for a in allowed)

    return sorted(
        f"{src} -> {dst}"
        for src, dsts in GRAPH.items()
        if src == prefix or src.startswith(prefix + ".")
        for dst in dsts
        if not inside(dst)
    )


def test_the_graph_sees_the_tree() -> None:
    assert "gateway.config.schema" in GRAPH
    assert "gateway.config.decode" in GRAPH["gateway.config.schema"]
    assert "gateway.scheduling.router" in GRAPH["gateway.app"]


def test_no_import_cycles() -> None:
    cycles = [" -> ".join(cycle) for cycle in _cycles(GRAPH)]
    assert cycles == [], "import cycles:\n  " + "\n  ".join(cycles)


def test_http_imports_nothing_else_of_the_gateway() -> None:
    assert _outside("gateway.http", ("gateway.http",)) == []


def test_config_is_plain_data() -> None:
    assert _outside("gateway.config", ("gateway.config", "gateway.errors")) == []


def test_simulator_stands_alone() -> None:
    assert _outside("gateway.sim", ("gateway.sim", "gateway.http")) == []


# --- packages: depend one way, in a declared order -------------------------

#: The gateway's packages (and top-level modules), lowest first. A package may
#: import only packages listed before it: a new upward edge, or a package not
#: listed here, fails `test_packages_depend_downward`.
LAYERS = (
    "errors",
    "buildinfo",
    "http",
    "config",
    "observability",
    "supervise",
    "sim",
    "engines",
    "state",
    "policies",
    "replicas",
    "request",
    "deadlines",
    "ingress",
    "forward",
    "policy",
    "scheduling",
    "admission",
    "pipeline",
    "admin",
    "checkconfig",
    "app",
    "demo",
    "cli",
    "__main__",
)

#: Packages a stage's record types may use: plain data and the replica set.
REQUEST_MAY_IMPORT = ("config", "errors", "policies", "replicas", "request")


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, dsts in graph.items():
        edges = out.setdefault(_package(src), set())
        edges.update(_package(dst) for dst in dsts if _package(dst) != _package(src))
    return out


PACKAGES = _package_graph(GRAPH)


def _mutual(packages: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} <-> {b}"
        for a, dsts in packages.items()
        for b in dsts
        if a < b and a in packages.get(b, set())
    )


def _upward(packages: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    rank = {name: i for i, name in enumerate(layers)}
    return sorted(
        f"{a} -> {b}"
        for a, dsts in packages.items()
        for b in dsts
        if a in rank and b in rank and rank[b] >= rank[a]
    )


def test_every_package_has_a_layer() -> None:
    undeclared = sorted(set(PACKAGES) - {""} - set(LAYERS))
    assert undeclared == [], f"declare these in LAYERS: {undeclared}"
    assert sorted(set(LAYERS) - set(PACKAGES)) == [], "LAYERS names a package that is gone"


def test_no_two_packages_import_each_other() -> None:
    assert _mutual(PACKAGES) == []


def test_packages_depend_downward() -> None:
    assert _upward(PACKAGES, LAYERS) == []


def test_the_layering_checks_catch_what_they_claim() -> None:
    """The checks above, on a graph with one upward edge and one mutual pair."""
    bad = {"request": {"config", "pipeline"}, "pipeline": {"request"}, "config": set()}
    assert _mutual(bad) == ["pipeline <-> request"]
    assert _upward(bad, ("config", "request", "pipeline")) == ["request -> pipeline"]
    assert "gateway.request.context" in GRAPH["gateway.policy.stage"]


def test_the_request_types_import_no_stage() -> None:
    allowed = tuple(f"{PACKAGE}.{name}" for name in REQUEST_MAY_IMPORT)
    assert _outside("gateway.request", allowed) == []


def test_only_the_app_imports_the_pipeline() -> None:
    importers = sorted(
        src
        for src, dsts in GRAPH.items()
        if _package(src) != "pipeline" and any(_package(d) == "pipeline" for d in dsts)
    )
    assert importers == ["gateway.app"]
