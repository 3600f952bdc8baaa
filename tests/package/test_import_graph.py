"""The package's import graph, read from the source with ast (every import, TYPE_CHECKING ones too):
data flows one way, and no module imports one that imports it back."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "infersight"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                # the longest prefix that is one of our modules
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("infersight"):
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    graph = {k: {d for d in v if not k.startswith(d + ".")} for k, v in _graph().items()}  # a package's own __init__ is not a back-arrow
    assert _cycles(graph) == []


@pytest.mark.parametrize("layer, forbidden", [
    ("infersight.runtime", ("infersight.agent", "infersight.exporters", "infersight.tracing", "infersight.dashboards")),
    ("infersight.exporters", ("infersight.agent",)),
    ("infersight.correlate", ("infersight.agent", "infersight.exporters")),
    ("infersight.vllm", ("infersight.agent", "infersight.exporters", "infersight.dashboards")),
])
def test_layers_import_only_downstream(layer: str, forbidden: tuple[str, ...]) -> None:
    bad = sorted(f"{m} -> {d}" for m, deps in _graph().items() if m == layer or m.startswith(layer + ".")
                 for d in deps if any(d == f or d.startswith(f + ".") for f in forbidden))
    assert bad == []
