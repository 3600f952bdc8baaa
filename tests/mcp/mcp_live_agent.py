"""The MCP tests' live agent (imported, not a conftest): `infersight agent` as a separate process beside
the reference engine (in the test process: the agent tests' tiny engine and workload), with the probe
calls teed here (tests/agent/probe_tee.py) as the independent record of what happened; and
`infersight mcp --transport streamable-http` in front of it, started while the workload runs (its
imports take seconds on a loaded machine)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_workload import Workload, free_port, make_engine, run_workload, unique_ring  # noqa: E402
from probe_tee import ProbeTee  # noqa: E402
from testkit import wait_for_process  # noqa: E402

from infersight.runtime import Engine  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
#: An MCP initialize request, as a client without the SDK would send it (the 401 checks).
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@dataclass
class LiveAgent:
    url: str
    token_file: Path
    work: Workload
    tee: ProbeTee
    engine: Engine
    mcp_url: str  # the streamable-HTTP MCP server's endpoint (behind the agent's token)

    def api(self, path: str, **params: object) -> dict:
        """The agent's JSON API, fetched by the test itself (not through the MCP server)."""
        return httpx.get(self.url + path, params=params, timeout=30).json()


@contextmanager
def start_live_agent(tmp: Path) -> Iterator[LiveAgent]:
    """The agent started, the workload run and every row reported; stopped on exit."""
    ring = unique_ring("mcp")
    engine, probe = make_engine(ring)
    tee = ProbeTee.attach(probe)
    port, log = free_port(), tmp / "agent.log"
    # The agent writes its token at its default place, here under this test's own state directory.
    env = {**ENV, "XDG_RUNTIME_DIR": "", "XDG_STATE_HOME": str(tmp / "state")}
    token_file = tmp / "state" / "infersight" / f"agent-{port}.token"
    with open(log, "w") as log_f:
        proc = subprocess.Popen([sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen",
                                 f"127.0.0.1:{port}", "--gpu-source", "none", "--poll-interval", "0.05"],
                                cwd=REPO, env=env, stdout=log_f, stderr=subprocess.STDOUT)
    procs = [proc]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_process(proc, log.read_text, "the agent attached to its ring",
                         lambda: ring in httpx.get(url + "/health", timeout=2).json()["rings"], timeout=90,
                         transient=(OSError, httpx.HTTPError))
        mcp_port, mcp_log = free_port(), tmp / "mcp.log"
        with open(mcp_log, "w") as log_f:  # the agent wrote its token before it served /health
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "infersight", "mcp", "--transport", "streamable-http", "--listen",
                 f"127.0.0.1:{mcp_port}", "--agent", url, "--token-file", str(token_file)],
                cwd=REPO, env=ENV, stdout=log_f, stderr=subprocess.STDOUT))
        work = run_workload(engine)
        wait_for_process(proc, log.read_text, "the agent's rows of every request",
                         lambda: httpx.get(url + "/api/v1/summary", timeout=5).json()["requests"] == len(work.prompts),
                         timeout=60, transient=(OSError, httpx.HTTPError))
        mcp_url = f"http://127.0.0.1:{mcp_port}/mcp"
        wait_for_process(procs[-1], mcp_log.read_text, "the MCP server's port",
                         lambda: httpx.post(mcp_url, json=INIT, timeout=2).status_code == 401, timeout=90,
                         transient=(OSError, httpx.HTTPError))
        yield LiveAgent(url, token_file, work, tee, engine, mcp_url)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        probe.close()
