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
                # "from pkg import sub": the module pkg.sub when it is one, else pkg (a name in it)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
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


#: Which top-level parts of the package may import which (dotted prefixes under infersight; "*": any).
#: Read with docs/architecture.md section 3: data flows engine -> ring -> agent -> exporters, and
#: nothing imports the stage that consumes its output. A part missing here fails the test.
ANY = ("*",)
#: Leaf modules any part may import: they import nothing of ours. A component's config raises
#: ConfigError and owns its CLI flag group, whose range-checked argparse types are numeric_flags'.
SHARED = ("config_error", "commands.numeric_flags")
RULES: dict[str, tuple[tuple[str, ...], str]] = {
    "runtime": ((), "the engine pays for nothing it does not run: it imports nothing of ours"),
    "models": ((), "model definitions, read by the runtime and the CLI"),
    "config_error": ((), "the usage error every component's config raises: a leaf any part may import (SHARED)"),
    "workload": ((), "the demo workload, shared by the engine side and the tools"),
    "probes": (("runtime",), "the engine's half of the ring observes the runtime (observer, stats, model config)"),
    "kernels": (("runtime.config", "runtime.model.model_config"), "trace readers: model shapes for the roofline only"),
    "correlate": (("kernels", "probes.records", "runtime.observer"),
                  "pure analyses over frames decoded from the record layout and the observer's enums"),
    "http": (("exporters.catalogue",), "the shared HTTP door: counts under catalogue names, serves no one part"),
    "gpu": (("exporters.catalogue", "exporters.exposition_parse"),
            "telemetry readers: the metric definitions and the text parser, never the exporters' collectors"),
    "exporters": (("correlate", "gpu", "probes.ring_discovery"),
                  "render what the agent hands them (MetricSource protocol), never the agent"),
    "serve": (("runtime", "probes", "exporters.catalogue", "http"),
              "the engine's process with an HTTP door: engine side plus the shared definitions"),
    "vllm": (("probes", "serve", "workload"),
             "the plugin loads inside vLLM's interpreter: only what the engine side needs"),
    "sources": (("correlate", "exporters", "kernels", "probes", "runtime.observer", "vllm.ids"),
                "the agent's engine sources: the agent builds them, so they never import it"),
    "tracing": (("correlate", "exporters", "http", "vllm.ids"),
                "the agent's tracing part: built by the agent with what it needs, never importing it"),
    "dashboards": (("correlate", "exporters", "gpu", "kernels"),
                   "generated from the catalogue and from the files a run wrote, not from a live agent"),
    "agent": (("correlate", "exporters", "gpu", "http", "kernels", "probes", "runtime.observer", "sources",
               "tracing"), "the top of the data path: it wires its parts and reads the engine side"),
    "training": (("runtime", "workload"), "trains the reference model on the runtime"),
    "mcp": (("agent.api.token_file", "http", "exporters.catalogue", "dashboards"),
            "a client of the agent's JSON API: the token and its check, the catalogue and dashboards as resources"),
    "bench": (("agent", "correlate", "kernels", "probes", "runtime", "workload"),
              "measuring tools: run an engine with probes and an agent, above both"),
    "fleet": (("exporters.catalogue",), "asks a Prometheus over HTTP (PromQL only): metric names from the "
                                        "catalogue, never the agent's state"),
    "commands": (ANY, "composition root: each command parses, calls a library function and prints"),
    "cli": (ANY, "composition root: the subcommand table"),
    "__main__": (ANY, "composition root: python -m infersight"),
    "demo": (ANY, "composition root: the demo runs an engine, an agent and the dashboards"),
    "demo_vllm": (ANY, "composition root: the demo beside a real vLLM"),
}


def _part(module: str) -> str:
    """The top-level part of a module (a demo_* module is the demo's: it composes like demo.py)."""
    part = module.split(".")[1] if "." in module else "__init__"
    return "demo" if part.startswith("demo_") else part


def _allowed(part: str, dep: str) -> bool:
    allowed = RULES[part][0]
    name = dep.removeprefix("infersight.")
    return allowed == ANY or name in SHARED or any(name == a or name.startswith(a + ".") for a in allowed)


def test_every_part_has_a_rule() -> None:
    parts = {_part(m) for m in _graph()} - {"__init__"}
    assert sorted(parts - RULES.keys()) == []


@pytest.mark.parametrize("part", sorted(RULES))
def test_parts_import_only_what_their_rule_allows(part: str) -> None:
    bad = sorted(f"{m} -> {d}" for m, deps in _graph().items() if _part(m) == part
                 for d in deps if _part(d) != part and _part(d) != "__init__" and not _allowed(part, d))
    assert bad == [], f"{part} may import only {RULES[part][0]}: {RULES[part][1]}"


def test_the_rules_catch_a_backward_import() -> None:
    """The check reads the rule, not the graph it was written from: an import of the agent from
    tracing, as tracing/hook.py once had under TYPE_CHECKING, is refused."""
    assert not _allowed("tracing", "infersight.agent.state")
    assert not _allowed("sources", "infersight.agent.capture.controller")
    assert not _allowed("runtime", "infersight.probes.observer")
    assert _allowed("agent", "infersight.tracing.hook") and _allowed("commands", "infersight.agent.service")
