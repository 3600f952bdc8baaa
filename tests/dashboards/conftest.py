"""Shared fixtures of the dashboards and report tests: a run directory as `infersight demo` writes
it (requests.parquet, events/*.parquet, summary.json), made fast by the tiny engine of the agent
tests and an in-process agent with --parquet-dir; and one run of the real demo, shared by every test
that needs it (it is the expensive one)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_workload import make_engine, run_workload, unique_ring  # noqa: E402

from infersight.agent.api import report  # noqa: E402
from infersight.agent.config import AgentConfig  # noqa: E402
from infersight.agent.slow.config import SlowRequestConfig
from infersight.agent.service import Agent  # noqa: E402


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A finished run's output directory (the agent closed, so every Parquet file is complete)."""
    out = tmp_path_factory.mktemp("run")
    ring = unique_ring("report")
    engine, probe = make_engine(ring)
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(out),
                              slow=SlowRequestConfig(min_requests_for_p99=2)))
    try:
        run_workload(engine, agent.poll_once)
        agent.poll_once()
        (out / "summary.json").write_text(json.dumps(report.summary(agent.state), indent=2))
    finally:
        agent.close()
        probe.close()
    return out


#: The demo as the CI runs it: short, but long enough for what every dashboard panel needs on a CPU:
#: flight-recorder windows (the first after ~10 busy steps), preemptions by swap and by recompute, and
#: slow requests (judged once 20 have finished).
DEMO_ARGS = ("--requests", "32", "--max-tokens", "24", "--device", "cpu")


@dataclass(frozen=True)
class DemoRun:
    out: Path
    stdout: str  # what the demo printed (rich wraps lines at the console width)
    ceilings_cache: Path  # $INFERSIGHT_CEILINGS as the demo saw it: empty, so it measured its own


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """`infersight demo` run once (engine + agent process + workload, CPU), with no ceilings cache:
    a fresh machine's, so the demo measures this CPU's ceilings itself."""
    tmp = tmp_path_factory.mktemp("demo")
    out, cache = tmp / "out", tmp / "no-ceilings.json"
    env = {**os.environ, "INFERSIGHT_CEILINGS": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "infersight", "demo", "--out", str(out), *DEMO_ARGS],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return DemoRun(out, proc.stdout, cache)
