"""Shared fixtures of the dashboards and report tests: a run directory as `infersight demo` writes
it (requests.parquet, events/*.parquet, summary.json), made fast by the tiny engine of the agent
tests and an in-process agent with --parquet-dir."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_workload import make_engine, run_workload, unique_ring  # noqa: E402

from infersight.agent import report  # noqa: E402
from infersight.agent.config import AgentConfig  # noqa: E402
from infersight.agent.service import Agent  # noqa: E402


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A finished run's output directory (the agent closed, so every Parquet file is complete)."""
    out = tmp_path_factory.mktemp("run")
    ring = unique_ring("report")
    engine, probe = make_engine(ring)
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(out), min_requests_for_p99=2))
    try:
        run_workload(engine, agent.poll_once)
        agent.poll_once()
        (out / "summary.json").write_text(json.dumps(report.summary(agent.state), indent=2))
    finally:
        agent.close()
        probe.close()
    return out
