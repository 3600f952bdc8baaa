"""The AgentConfig split (issue 31 item 4) keeps `infersight agent`'s command line as it was: the same
flags with the same defaults, and the same values reaching the config from a full and a minimal argv.
Expected: snapshots/agent_flags.json, written by agent_flags_snapshot.py on the commit before the split
(its header names it)."""
from __future__ import annotations

import json

import pytest

from agent_flags_snapshot import FULL, SNAPSHOT, built_config, flags


@pytest.fixture(scope="module")
def before() -> dict:
    return json.loads(SNAPSHOT.read_text())


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
    assert {name: now.get(name, "(missing)") for name in before[argv]} == before[argv]  # new fields: new features
