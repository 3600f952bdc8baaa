"""A real Prometheus server for tests: scrapes one target every second, exemplar storage on."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from agent_workload import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
requires_prometheus = pytest.mark.skipif(
    not Path(PROMETHEUS).exists(), reason="needs a Prometheus server binary (/usr/bin/prometheus; `make services`)")


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
