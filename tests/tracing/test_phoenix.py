"""End to end with a real Arize Phoenix: the example agent app (its own TracerProvider) calls the
server with trace context; `infersight agent` (a separate process, as a user runs it) builds the
engine's spans and exports them to the same Phoenix. The trace must read

    invoke_agent -> agent.step -> chat (the app's LLM call) -> chat (the engine request)
                                                                 -> queue / prefill / decode

Phoenix ingests OTLP/HTTP protobuf at /v1/traces and writes spans in the background, so its REST
API is polled. The Phoenix is the session's (tests/conftest.py, tests/phoenix_server.py): this test
reads its own trace's spans only. Without Phoenix (not installed, or it does not start) a skip,
saying why; under CI=true a failure (testkit.require_service).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from phoenix_server import phoenix_spans, ts
from serve_fixtures import MODEL, Harness, free_port, real_server

from infersight.serve.config import ServeConfig

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


class Agent:
    """`infersight agent` on the harness's ring, exporting spans to Phoenix."""

    def __init__(self, ring: str, otlp: str, log: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        env = {**ENV, "OTEL_BSP_SCHEDULE_DELAY": "100"}  # export within 0.1 s, not the default 5 s
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen", self.url[len("http://"):],
                 "--poll-interval", "0.05", "--model-name", MODEL, "--otlp-endpoint", otlp],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=out)
        self.log = log
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"the agent exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"the agent did not attach: {log.read_text()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).json()["rings"] == [ring]:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_agent_app_trace_reaches_phoenix(phoenix: str, tmp_path: Path) -> None:
    with Harness(ServeConfig(model_name=MODEL)) as h, real_server(h) as server:
        agent = Agent(h.ring, phoenix, tmp_path / "agent.log")
        try:
            app = subprocess.run([sys.executable, str(REPO / "examples" / "agent_app.py"), "--server", server,
                                  "--otlp", phoenix, "--model", MODEL, "--steps", "2", "--max-tokens", "8"],
                                 cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
            assert app.returncode == 0, app.stderr
            run = json.loads(app.stdout.strip().splitlines()[-1])
            calls = {c["span_id"]: c for c in run["calls"]}
            assert len(calls) == 2

            deadline = time.monotonic() + 40
            while True:  # Phoenix writes in the background: poll until the engine spans and children are in
                spans = [s for s in phoenix_spans(phoenix) if s["context"]["trace_id"] == run["trace_id"]]
                engine = [s for s in spans if s["parent_id"] in calls and s["name"] == f"chat {MODEL}"]
                kids = {s["parent_id"] for s in spans if s["name"] in ("queue", "prefill", "decode")}
                if len(engine) == 2 and all(e["context"]["span_id"] in kids for e in engine):
                    break
                assert time.monotonic() < deadline, (f"spans did not arrive: {[s['name'] for s in spans]}\n"
                                                     f"{agent.log.read_text()[-2000:]}")
                time.sleep(0.5)
        finally:
            agent.stop()

    by_id = {s["context"]["span_id"]: s for s in spans}
    names = {s["name"] for s in spans}
    assert {"invoke_agent demo-agent", "agent.step 0", "agent.step 1", "execute_tool word_count"} <= names
    for span in engine:
        call = calls[span["parent_id"]]
        client = by_id[span["parent_id"]]  # the app's LLM call, under an agent step
        assert client["name"] == f"chat {MODEL}" and by_id[client["parent_id"]]["name"].startswith("agent.step")
        a = span["attributes"]
        assert a["infersight.request_id"] == call["request_id"]
        assert a["llm.token_count.prompt"] == a["gen_ai.usage.input_tokens"] == call["usage"]["prompt_tokens"]
        assert a["llm.token_count.completion"] == a["gen_ai.usage.output_tokens"] == call["usage"]["completion_tokens"]
        assert a["gen_ai.operation.name"] == "chat" and a["session.id"] == run["session_id"]
        assert span["span_kind"] == "LLM"
        children = [s for s in spans if s["parent_id"] == span["context"]["span_id"]]
        assert {c["name"] for c in children} == {"queue", "prefill", "decode"}
        for child in children:
            assert ts(span["start_time"]) <= ts(child["start_time"]) <= ts(child["end_time"]) <= ts(span["end_time"])
        # No prompt text by default: the app's messages appear on its own spans only.
        assert "Count the words" not in json.dumps(span) + json.dumps(children)
        assert "input.value" not in a  # (Phoenix fills output.value in itself when a span has none)
        if len(call["text"].strip()) >= 3:
            assert call["text"] not in str(a.get("output.value", ""))
