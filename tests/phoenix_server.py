"""A real Arize Phoenix for the tests that export spans to it (tests/tracing/test_phoenix.py,
tests/vllm/test_vllm_traces.py): started once per session by tests/conftest.py's `phoenix` fixture
(a fresh Phoenix migrates its database first: tens of seconds on 2 cores), and its REST API read
back. Tests share it by filtering the spans they read by their own trace id.

Without Phoenix (not installed, or it does not start) a skip, saying why; under CI=true a failure
(testkit.require_service)."""
from __future__ import annotations

import datetime as dt
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from testkit import free_port, require_service

#: A fresh Phoenix migrates its database before it answers: 19 s on a 2-core machine at load 4, over
#: 60 s (still migrating) with other test suites beside it. Slow is not missing: under CI it must come up.
STARTUP_S = 180.0


@contextmanager
def running_phoenix(work: Path) -> Iterator[str]:
    """A Phoenix server with its database in `work`; yields its base URL once /healthz answers."""
    if importlib.util.find_spec("phoenix") is None:  # (a submodule's spec would import Phoenix here: slow)
        require_service("Phoenix", "arize-phoenix is not installed (it is in the `test` extra: pip install -e '.[test]')")
    port = free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(work), "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = work / "phoenix.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "phoenix.server.main", "serve"], cwd=work, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                require_service("Phoenix", f"it exited ({proc.returncode}) on startup: {log.read_text()[-600:]}")
            if time.monotonic() > deadline:
                require_service("Phoenix", f"it did not answer /healthz within {STARTUP_S:.0f} s: {log.read_text()[-600:]}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def phoenix_spans(url: str) -> list[dict[str, Any]]:
    """Every span of Phoenix's default project (callers keep their own trace's)."""
    spans, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = httpx.get(f"{url}/v1/projects/default/spans", params=params, timeout=10)
        if page.status_code == 404:  # the project appears with its first span
            return []
        page.raise_for_status()
        body = page.json()
        spans += body["data"]
        cursor = body.get("next_cursor")
        if not cursor:
            return spans


def ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
