"""The runtime's rooms (docs/runtime.md) import one way: the model is the bottom room, the engine's
loop the top. Read from the source with the import graph of test_import_graph (TYPE_CHECKING imports too)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("import_graph", Path(__file__).with_name("test_import_graph.py"))
assert _spec is not None and _spec.loader is not None
_import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_import_graph)

ROOMS = ("engine", "model", "runner", "kv", "speculative", "checkpoints", "parallel")
#: Which other rooms each room may import (the shared top level, config, errors, observer, ranges,
#: stats and tokenizer, any room may). Dotted names under infersight.runtime; a room alone: all of it.
RULES: dict[str, tuple[tuple[str, ...], str]] = {
    "model": (("checkpoints",), "the bottom room: the network knows no engine, runner, KV manager or draft"),
    "checkpoints": (("model.model_config", "model.weights"), "a model directory read into shapes and weights"),
    "kv": (("engine.request",), "block tables per request: the request's state, never the loop"),
    "runner": (("model", "engine.request"), "a model run on a batch of requests' feeds"),
    "speculative": (("engine.request", "engine.sampling", "engine.scheduler", "runner.model_runner"),
                    "the draft's turn and verification: requests, samplers and the draft's runner, never the loop"),
    "engine": (("model", "runner", "kv", "speculative", "checkpoints"), "the loop: composes every other room"),
    "parallel": (("engine", "model"), "an expert-parallel Engine: subclasses the loop, shards the model"),
    "top": (("model.model_config", "engine.run_policy"),
            "what every room shares: config and observer name the model's shapes, the observer hands on a run policy"),
}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["infersight", "runtime"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ROOMS and len(parts) > 3 else "top"


def _allowed(room: str, dep: str) -> bool:
    name = dep.removeprefix("infersight.runtime.")
    return any(name == a or name.startswith(a + ".") for a in RULES[room][0])


def test_every_room_has_a_rule() -> None:
    rooms = {_room(m) for m in _import_graph._graph()} - {None}
    assert sorted(rooms - RULES.keys()) == []


@pytest.mark.parametrize("room", sorted(RULES))
def test_rooms_import_only_what_their_rule_allows(room: str) -> None:
    bad = sorted(f"{m} -> {d}" for m, deps in _import_graph._graph().items() if _room(m) == room
                 for d in deps if _room(d) not in (None, "top", room) and not _allowed(room, d))
    assert bad == [], f"runtime/{room} may import only {RULES[room][0]}: {RULES[room][1]}"


def test_the_rules_catch_a_backward_import() -> None:
    """The rule, not the graph it was written from: the model importing the engine, or the KV
    manager importing the loop, is refused."""
    assert not _allowed("model", "infersight.runtime.engine.request")
    assert not _allowed("kv", "infersight.runtime.engine.engine")
    assert _allowed("speculative", "infersight.runtime.engine.scheduler")
