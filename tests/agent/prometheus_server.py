"""A real Prometheus server for tests: scrapes one target every second, exemplar storage on."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from agent_workload import free_port, make_engine, run_workload, unique_ring
from testkit import needs_service

from infersight.agent.config import AgentConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.agent.recorder.config import RecorderConfig
from infersight.agent.service import Agent

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
requires_prometheus = needs_service("Prometheus", Path(PROMETHEUS).exists(),
                                    "no Prometheus server binary (/usr/bin/prometheus; `make services` installs it)")


#: The flight recorder as a run of a few hundred steps needs it for every kernel series to have data:
#: a budget high enough for several windows (each costs ~0.3 s on a small CPU), and a preemption-storm
#: trigger that the workload's forced preemptions set off (a full capture of 2 steps).
DEMO_RECORDER = RecorderConfig(budget=0.45, min_interval_s=0.0, initial_cost_s=0.005, preemption_storm=1,
                               step_jump=None, trigger_steps=2, trigger_cooldown_s=3600)


@dataclass
class ScrapedRun:
    url: str
    work: Any  # agent_workload's workload record
    agent: Agent
    probe: Any
    log: Path


def measured_cpu_ceilings(tmp: Path) -> Path:
    """This CPU's roofline ceilings measured as a user would (`infersight bench ceilings`, small sizes)
    into a cache of the test's own, to point INFERSIGHT_CEILINGS at: without a ceiling known, the
    roofline metrics rightly stay absent. In a child process, whose torch threads then leave the
    agent's scrapes alone."""
    cache = tmp / "ceilings.json"
    subprocess.run([sys.executable, "-m", "infersight", "bench", "ceilings", "--device", "cpu", "--copy-mib", "16",
                    "--gemm-n", "256", "--repeats", "2", "--cache", str(cache), "--json"], check=True,
                   capture_output=True, timeout=300)
    return cache


def start_prometheus(tmp: Path, target_port: int, job: str) -> tuple[subprocess.Popen, str, Path]:
    """(process, base URL, log path) once /-/ready answers; fails the test with its log otherwise."""
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: {job}
    static_configs:
      - targets: ['127.0.0.1:{target_port}']
""")
    log = tmp / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage"],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"prometheus was not ready within 30 s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def query(url: str, expr: str) -> list[dict]:
    resp = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
    body = resp.json()
    assert resp.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


@contextmanager
def scraped_workload(tmp: Path, tag: str, job: str, settle_s: float = 0.0,
                     recorder: RecorderConfig | None = None) -> Iterator[ScrapedRun]:
    """The tiny engine runs the workload beside an in-process agent that a real Prometheus scrapes;
    yields once Prometheus holds a scrape taken settle_s after the agent's last change (2 s gives
    every series the two samples rate() needs)."""
    ring = unique_ring(tag)
    engine, probe = make_engine(ring, nvtx=recorder is not None)
    # min_requests_for_p99=2: with six requests the slow-request attribution has something to do.
    # recorder: the flight recorder on, with its windows in the probe's capture directory.
    agent = Agent(AgentConfig(rings=[ring], port=0, flight_recorder=recorder,
                              slow=SlowRequestConfig(min_requests_for_p99=2)))
    agent.start_http()
    proc = None
    try:
        proc, url, log = start_prometheus(tmp, agent.port, job)
        if recorder is not None:  # its counters start at 0 in a first scrape, so rate() sees their first rise
            first = time.monotonic() + 30
            while not query(url, f'up{{job="{job}"}}') and time.monotonic() < first:
                time.sleep(0.1)
        work = run_workload(engine, agent.poll_once)
        agent.poll_once()
        settled = time.time() + settle_s  # nothing changes in the agent's state after this
        deadline = time.monotonic() + 30
        while True:
            # timestamp() of a bare selector is the scrape's own time (of an expression it would be the
            # evaluation time); a failed scrape (up == 0) leaves the series stale, so wait for a good one.
            last = query(url, f'timestamp(up{{job="{job}"}})')
            good = query(url, f'up{{job="{job}"}} == 1')
            if last and good and float(last[0]["value"][1]) > settled:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not scrape the agent within 30 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield ScrapedRun(url, work, agent, probe, log)
    finally:
        if proc is not None:
            stop(proc)
        agent.close()
        probe.close()
