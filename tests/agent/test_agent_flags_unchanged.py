"""The AgentConfig split (issue 31 item 4) keeps `infersight agent`'s command line as it was: the same
flags with the same defaults, and the same values reaching the config from a full and a minimal argv.
Expected: snapshots/agent_flags.json, written by agent_flags_snapshot.py on the commit before the split
(its header names it)."""
from __future__ import annotations

import json

import pytest

from agent_flags_snapshot import FULL, SNAPSHOT, built_config, flags


#: Defaults changed on purpose since the snapshot, each with its reason: (config group, field) -> (old, new).
#: The snapshot's value is checked to be the old one, then compared as the new one.
CHANGED_DEFAULTS = {
    # Issue 32: the recorder's first window keeps its budget (agent.recorder.config.INITIAL_COST_S).
    ("flight_recorder", "initial_cost_s"): (0.05, 1.0),
}


@pytest.fixture(scope="module")
def before() -> dict:
    doc = json.loads(SNAPSHOT.read_text())
    for argv in ("full", "minimal"):
        for (group, field), (old, new) in CHANGED_DEFAULTS.items():
            if isinstance(doc[argv].get(group), dict):
                assert doc[argv][group][field] == old, (argv, group, field)
                doc[argv][group][field] = new
    return doc


def test_the_full_argv_sets_every_flag(before: dict) -> None:
    """Else a flag whose value went astray would not show: FULL names each one."""
    assert {f for flag in before["flags"] for f in flag["flags"]} - set(FULL) == set()


def test_the_same_flags_with_the_same_defaults(before: dict) -> None:
    """Names, defaults, constants, choices, types; the help text and its groups may differ, and
    features added since bring flags of their own."""
    now = {tuple(flag["flags"]): flag for flag in flags()}
    assert [now.get(tuple(flag["flags"])) for flag in before["flags"]] == before["flags"]


@pytest.mark.parametrize("argv", ["full", "minimal"])
def test_the_same_config_from_the_same_argv(before: dict, argv: str) -> None:
    from agent_flags_snapshot import MINIMAL

    now = built_config(FULL if argv == "full" else MINIMAL)

    def known(name: str) -> object:
        """The value now of a field the snapshot has; in a config group, only the group's fields it has
        (new fields, top-level or in a group, are new features: e.g. tracing.step_links)."""
        value, then = now.get(name, "(missing)"), before[argv][name]
        return {k: value.get(k, "(missing)") for k in then} if isinstance(then, dict) and isinstance(value, dict) else value

    assert {name: known(name) for name in before[argv]} == before[argv]
