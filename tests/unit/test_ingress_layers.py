"""The ingress's layering, read from the source with `ast` (every import in a module counts,
those under `if TYPE_CHECKING:` and inside functions included):

(a) no import cycles among continuum_ingress modules;
(b) adapters (any `adapters` package of the ingress: adapters/, cache/adapters/, kv/adapters/,
    gemini/adapters/) import no policy (any `policy` package or module of the ingress) and not
    the request orchestrator (forwarding.py);
(c) protocol modules (any `protocol` package of the ingress) import no adapters.

Each rule is also run on a small synthetic graph that breaks it, so the checks can fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import continuum_ingress

PACKAGE = "continuum_ingress"
ORCHESTRATORS = frozenset({f"{PACKAGE}.forwarding"})


def _modules(root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(module: str, path: Path, known: Iterable[str]) -> set[str]:
    """The continuum_ingress modules `module` imports (`from pkg import name` counts as the
    submodule `pkg.name` when that is a module, else as `pkg`)."""
    known = set(known)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names]
        else:
            continue
        for name in names:
            # `import a.b.c` also imports a and a.b; count the deepest known module.
            target = name
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    root = Path(continuum_ingress.__file__).parent
    modules = _modules(root)
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _parts(module: str) -> list[str]:
    return module.split(".")[1:]


def is_adapter(module: str) -> bool:
    return "adapters" in _parts(module)


def is_policy(module: str) -> bool:
    return "policy" in _parts(module)


def is_protocol(module: str) -> bool:
    return "protocol" in _parts(module)


def layer_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    out: list[str] = []
    for module, imports in sorted(graph.items()):
        for target in sorted(imports):
            if is_adapter(module) and is_policy(target):
                out.append(f"adapter {module} imports policy {target}")
            if is_adapter(module) and target in ORCHESTRATORS:
                out.append(f"adapter {module} imports the orchestrator {target}")
            if is_protocol(module) and is_adapter(target):
                out.append(f"protocol {module} imports adapter {target}")
    return out


# -- the checks can fail ------------------------------------------------------------------------


def test_the_checks_catch_a_synthetic_violation() -> None:
    p = PACKAGE
    graph = {
        f"{p}.state": {f"{p}.protocol.dialects"},
        f"{p}.protocol.dialects": {f"{p}.adapters.upstream"},
        f"{p}.adapters.upstream": {f"{p}.state", f"{p}.policy.breaker", f"{p}.forwarding"},
        f"{p}.cache.adapters.redis_store": {f"{p}.cache.policy.eligibility"},
        f"{p}.kv.adapters.tokenize": {f"{p}.gemini.policy"},
        f"{p}.gemini.protocol.sse": {f"{p}.gemini.adapters.bus"},
        f"{p}.policy.breaker": set(),
        f"{p}.forwarding": {f"{p}.adapters.h1"},
    }
    assert cycles(graph) == [[f"{p}.adapters.upstream", f"{p}.protocol.dialects", f"{p}.state"]]
    assert sorted(layer_violations(graph)) == [
        f"adapter {p}.adapters.upstream imports policy {p}.policy.breaker",
        f"adapter {p}.adapters.upstream imports the orchestrator {p}.forwarding",
        f"adapter {p}.cache.adapters.redis_store imports policy {p}.cache.policy.eligibility",
        f"adapter {p}.kv.adapters.tokenize imports policy {p}.gemini.policy",
        f"protocol {p}.gemini.protocol.sse imports adapter {p}.gemini.adapters.bus",
        f"protocol {p}.protocol.dialects imports adapter {p}.adapters.upstream",
    ]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_are_read_from_every_place_in_a_module(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    (pkg / "adapters").mkdir(parents=True)
    for name in ("__init__.py", "adapters/__init__.py", "adapters/h1.py", "state.py", "forwarding.py"):
        (pkg / name).write_text("")
    (pkg / "adapters" / "upstream.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import h1\n"
        "if TYPE_CHECKING:\n"
        "    from continuum_ingress.state import RequestState\n"
        "def later() -> None:\n"
        "    import continuum_ingress.forwarding\n"
    )
    modules = _modules(pkg)
    found = _imported(f"{PACKAGE}.adapters.upstream", pkg / "adapters" / "upstream.py", modules)
    assert found == {f"{PACKAGE}.adapters.h1", f"{PACKAGE}.state", f"{PACKAGE}.forwarding"}


# -- the ingress --------------------------------------------------------------------------------


def test_the_graph_covers_the_ingress() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.forwarding" in graph and f"{PACKAGE}.adapters.h1" in graph
    assert f"{PACKAGE}.adapters.h1" in graph[f"{PACKAGE}.adapters.upstream"]
    assert any(is_policy(m) for m in graph) and any(is_protocol(m) for m in graph)
    assert any(is_adapter(m) and m.startswith(f"{PACKAGE}.cache.") for m in graph)


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert found == []


def test_adapters_import_no_policy_nor_the_orchestrator_and_protocol_no_adapters() -> None:
    assert layer_violations(import_graph()) == []
