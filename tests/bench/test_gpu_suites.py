"""benchmarks/gpu.sh: every suite it defines can be run by name, and every name it runs is described in its
header. A suite defined but left off SUITES cost a device call on 2026-12-05 (it answered "unknown suite")."""
from __future__ import annotations

import re
from pathlib import Path

GPU_SH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.sh"
HELPERS = {"stamp", "serving_once", "demo_events", "expert_parallel"}  # functions the suites call, not suites


def test_every_defined_suite_is_runnable_and_described() -> None:
    text = GPU_SH.read_text()
    defined = set(re.findall(r"^([a-z0-9_]+)\(\) \{", text, re.M)) - HELPERS
    runnable = set(re.search(r'^SUITES="([^"]+)"', text, re.M).group(1).split())
    header = text.split("\nsource ", 1)[0]
    described = {name for name in re.findall(r"^#   ([a-z0-9_]+)", header, re.M)} | set(
        re.findall(r"^#   [a-z0-9_]+, ([a-z0-9_]+)", header, re.M))
    assert defined == runnable
    assert runnable <= described, sorted(runnable - described)
