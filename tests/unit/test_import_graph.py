"""The allowed import directions between the packages (docs/architecture.md, "Packages and import
directions"), checked over the source with `ast`: every import, including those inside functions,
under `if TYPE_CHECKING:` and `importlib.import_module("...")` with a literal name.

* continuum_common imports no other first-party package;
* a service (ingress, indexer, listener, gemini-cache, sim) imports itself and continuum_common;
* continuum_router, the launcher, imports any service and continuum_common; continuum_bench only
  inside a function (the `bench` subcommand hands over to it), continuum_testing never;
* continuum_bench and continuum_testing (under bench/ and libs/testing/) are not checked: they may
  import anything, and nothing above may import them at module level.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMON = "continuum_common"
LAUNCHER = "continuum_router"
SERVICES = frozenset(
    {"continuum_ingress", "continuum_indexer", "continuum_listener", "continuum_gemini_cache", "continuum_sim"}
)
TOOLS = frozenset({"continuum_bench", "continuum_testing"})
FIRST_PARTY = frozenset({COMMON, LAUNCHER, *SERVICES, *TOOLS})


@dataclass(frozen=True)
class Edge:
    source: str  # the importing package
    target: str  # the imported package (top-level name)
    where: str  # path:line
    in_function: bool = False  # inside a def (runs when called, not at import)


def violation(edge: Edge) -> str | None:
    """Why `edge` breaks the rules, or None when it is allowed."""
    source, target = edge.source, edge.target
    if target not in FIRST_PARTY or target == source:
        return None
    if source == COMMON:
        return f"{edge.where}: continuum_common imports {target} (the shared library imports no package above it)"
    if source in SERVICES:
        if target == COMMON:
            return None
        return f"{edge.where}: service {source} imports {target} (a service imports only continuum_common)"
    if source == LAUNCHER:
        if target == "continuum_testing":
            return f"{edge.where}: the launcher imports continuum_testing (test support stays out of the product)"
        if target == "continuum_bench" and not edge.in_function:
            return f"{edge.where}: the launcher imports continuum_bench at module level (only the bench subcommand may, lazily)"
        return None
    return None  # continuum_bench, continuum_testing: anything


class _Collector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[str, int, bool]] = []
        self._depth = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, name: str, line: int) -> None:
        self.found.append((name.split(".", maxsplit=1)[0], line, self._depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:  # relative imports stay inside the package
            self._add(node.module, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self._add(first.value, node.lineno)
        self.generic_visit(node)


def imports_in(source: str) -> list[tuple[str, int, bool]]:
    """(top-level package, line, inside a function) for every import in `source`."""
    collector = _Collector()
    collector.visit(ast.parse(source))
    return collector.found


def package_roots() -> dict[str, Path]:
    """Every checked package: continuum_common and the packages under services/."""
    roots = {COMMON: ROOT / "libs/common" / COMMON}
    for service_dir in sorted((ROOT / "services").iterdir()):
        for package in sorted(service_dir.glob("continuum_*/__init__.py")):
            roots[package.parent.name] = package.parent
    return roots


def edges(roots: dict[str, Path]) -> Iterator[Edge]:
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            where = path.relative_to(ROOT)
            for target, line, in_function in imports_in(path.read_text(encoding="utf-8")):
                yield Edge(package, target, f"{where}:{line}", in_function)


def violations(found: Iterable[Edge]) -> list[str]:
    return [v for v in map(violation, found) if v is not None]


def test_every_package_under_services_is_classified() -> None:
    """A new service must be added to SERVICES (or be the launcher) to be checked at all."""
    found = set(package_roots()) - {COMMON}
    assert found == SERVICES | {LAUNCHER}, found ^ (SERVICES | {LAUNCHER})


def test_the_packages_import_only_in_the_allowed_directions() -> None:
    roots = package_roots()
    found = list(edges(roots))
    assert len(found) > 500  # the walk saw the code (an empty walk would pass trivially)
    assert violations(found) == []


def test_the_launcher_composes_several_services() -> None:
    """The launcher is where the services meet: it imports more than one of them."""
    targets = {e.target for e in edges(package_roots()) if e.source == LAUNCHER}
    assert len(targets & SERVICES) >= 3, targets


# ---- the checker itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edge", "allowed"),
    [
        (Edge("continuum_ingress", "continuum_common", "x"), True),
        (Edge("continuum_ingress", "continuum_ingress", "x"), True),
        (Edge("continuum_ingress", "nats", "x"), True),
        (Edge("continuum_ingress", "continuum_indexer", "x"), False),
        (Edge("continuum_ingress", "continuum_indexer", "x", in_function=True), False),
        (Edge("continuum_indexer", "continuum_router", "x"), False),
        (Edge("continuum_sim", "continuum_testing", "x"), False),
        (Edge("continuum_common", "continuum_ingress", "x"), False),
        (Edge("continuum_common", "continuum_bench", "x", in_function=True), False),
        (Edge("continuum_router", "continuum_indexer", "x"), True),
        (Edge("continuum_router", "continuum_bench", "x", in_function=True), True),
        (Edge("continuum_router", "continuum_bench", "x"), False),
        (Edge("continuum_router", "continuum_testing", "x", in_function=True), False),
        (Edge("continuum_testing", "continuum_router", "x"), True),
    ],
)
def test_the_rules_on_synthetic_edges(edge: Edge, allowed: bool) -> None:
    assert (violation(edge) is None) is allowed


def test_the_collector_sees_every_kind_of_import() -> None:
    source = """
from __future__ import annotations
import continuum_common.config
from typing import TYPE_CHECKING
from . import sibling
if TYPE_CHECKING:
    from continuum_indexer.app import IndexerApp
def run():
    import continuum_bench.fleet
    return importlib.import_module("continuum_listener.app")
class K:
    async def go(self):
        from continuum_sim import SimFleet
"""
    found = imports_in(source)
    assert ("continuum_common", 3, False) in found
    assert ("continuum_indexer", 7, False) in found  # TYPE_CHECKING counts
    assert ("continuum_bench", 9, True) in found
    assert ("continuum_listener", 10, True) in found
    assert ("continuum_sim", 13, True) in found
    assert all(name != "sibling" for name, _, _ in found)
    bad = [Edge("continuum_ingress", t, f"s:{line}", f) for t, line, f in found]
    assert len(violations(bad)) == 4  # indexer, bench, listener, sim
