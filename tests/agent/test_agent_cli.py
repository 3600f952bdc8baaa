"""`infersight agent` as a user runs it: bad input is a one-line message and exit code 2, never a
traceback; a missing ring is logged and retried while the agent keeps serving, and attached once
it appears."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agent_workload import free_port, make_engine, unique_ring
from testkit import wait_for_process

from infersight.runtime import SamplingParams

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def agent_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "infersight", "agent", *args]


def run_agent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(agent_cmd(*args), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)


def assert_one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("infersight: error: ")
    return lines[0]


def test_no_ring_is_a_usage_error() -> None:
    line = assert_one_line_error(run_agent())
    assert "--ring" in line


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:http", "127.0.0.1:", "127.0.0.1:70000"])
def test_bad_listen_is_a_usage_error(listen: str) -> None:
    line = assert_one_line_error(run_agent("--ring", "infersight-unused", "--listen", listen))
    assert "listen" in line or "port" in line


@pytest.mark.parametrize("gpus", ["a,b", "-1", ","])
def test_bad_energy_gpus_is_a_usage_error(gpus: str) -> None:
    line = assert_one_line_error(run_agent("--ring", "infersight-unused", "--energy-gpus", gpus))
    assert "--energy-gpus" in line


@pytest.mark.parametrize("flag,value", [("--slow-quantile", "1.5"), ("--slo-e2e-s", "0")])
def test_bad_slow_rule_is_a_usage_error(flag: str, value: str) -> None:
    line = assert_one_line_error(run_agent("--ring", "infersight-unused", flag, value))
    assert flag in line  # the message names the flag


def test_the_retention_budget_is_a_flag_the_agent_states() -> None:
    res = run_agent("--ring", "infersight-unused", "--listen", f"127.0.0.1:{free_port()}", "--duration", "0.3",
                    "--gpu-source", "none", "--retention-mib", "2.5")
    assert res.returncode == 0, res.stderr
    assert "retention: finished requests' rows up to 2.5 MiB of row data (--retention-mib)" in res.stderr
    res = run_agent("--ring", "infersight-unused", "--retention-mib", "0")  # argparse's own one-line error
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stdout == ""
    assert res.stderr.strip() == ("infersight agent: error: argument --retention-mib: 0 is out of range: expected "
                                  "[0.0625, 65536] (see infersight agent --help)")


def test_port_in_use_is_a_usage_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = assert_one_line_error(run_agent("--ring", "infersight-unused", "--listen", f"127.0.0.1:{port}"))
    assert "in use" in line and str(port) in line


class AgentProc:
    """`infersight agent` in the background, its log (stderr) in a file."""

    def __init__(self, log: Path, *args: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(agent_cmd("--listen", f"127.0.0.1:{self.port}", *args), cwd=REPO, env=ENV,
                                         stdout=subprocess.DEVNULL, stderr=out)

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def get(self, path: str) -> dict:
        return httpx.get(self.base + path, timeout=2).json()

    def wait_for(self, what: str, check, timeout: float = 20.0):
        return wait_for_process(self.proc, lambda: self.log, what, check, timeout, (httpx.HTTPError,))

    def finish(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def test_missing_ring_is_retried_while_serving(tmp_path) -> None:
    ring = unique_ring("missing")
    agent = AgentProc(tmp_path / "agent.log", "--ring", ring, "--duration", "2", "--poll-interval", "0.05")
    try:
        health = agent.wait_for("/health", lambda: agent.get("/health"))
        assert health == {"status": "ok", "rings": []}
        assert agent.get("/api/v1/summary")["requests"] == 0
        assert agent.proc.poll() is None  # still running with nothing to read
    finally:
        rc = agent.finish()
    assert rc == 0, agent.log
    lines = [line for line in agent.log.splitlines() if ring in line]
    assert lines and all("not found" in line and "retrying" in line for line in lines), agent.log
    assert "Traceback" not in agent.log


def test_ring_that_appears_later_is_attached(tmp_path) -> None:
    ring = unique_ring("late")
    # 15 s: a loaded 2-core host once spent the whole of 6 s before the ring was attached.
    agent = AgentProc(tmp_path / "agent.log", "--ring", ring, "--duration", "15", "--poll-interval", "0.05")
    probe = None
    try:
        agent.wait_for("/health", lambda: agent.get("/health"))
        time.sleep(1.0)
        assert "not found" in agent.log
        engine, probe = make_engine(ring)  # the ring appears while the agent runs
        agent.wait_for("the ring to be attached", lambda: agent.get("/health")["rings"] == [ring])
        for i in range(2):
            engine.add_request(f"late request {i}", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        agent.wait_for("both requests", lambda: agent.get("/api/v1/summary")["requests"] == 2)
        rc = agent.finish()
    finally:
        if agent.proc.poll() is None:  # a failure above: do not leave it running
            agent.proc.kill()
            agent.proc.wait()
        if probe is not None:
            probe.close()
    assert rc == 0, agent.log
    assert f"attached to ring '{ring}'" in agent.log
    assert agent.log.index("not found") < agent.log.index("attached to ring")
    assert "Traceback" not in agent.log
