"""The agent's poll confines each source (agent.poll_guard, issue 33 item 1): a source whose step
raises costs that step, counted by source on /metrics and logged once per kind, and the other sources
and the HTTP server go on. The failures are planted here (a decoder bug stands in as a KeyError, a
deep message as a RecursionError), so the expected counts are the number of polls that met them."""
from __future__ import annotations

import logging
from pathlib import Path

import httpx
import msgspec
import pytest
import zmq
from testkit import free_port

from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.sources.vllm.kv_config import VllmKvConfig
from infersight.agent.service import Agent
from infersight.sources.vllm import kv_events as vllm_kv_events

POLLS = 3
PAYLOAD = msgspec.msgpack.encode([1000.0, [{"type": "BlockStored", "block_hashes": [1]}], 0])


def _samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_a_source_that_raises_is_counted_and_the_others_go_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    agent = Agent(AgentConfig(port=0, captures=CaptureConfig(token_file=str(tmp_path / "token")),
                              gpu=GpuConfig(source="none"), vllm_kv=VllmKvConfig(events=endpoint)))
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)  # vLLM's side: connects to the endpoint the agent binds
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)
    seq = 0

    def send_and_poll() -> None:
        nonlocal seq
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), PAYLOAD])
        seq += 1
        agent.poll_once()  # never raises

    def decoder_bug(*args: object) -> None:
        raise KeyError("a decoder bug nobody foresaw")

    def too_deep(readings: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    try:
        agent.start_http()
        monkeypatch.setattr(vllm_kv_events, "decode_message", decoder_bug)  # inside the KV subscriber's poll
        monkeypatch.setattr(agent.state, "add_gpu_samples", too_deep)  # the GPU step, once in every poll
        polls = 0
        with caplog.at_level(logging.ERROR, logger="infersight.agent"):
            while agent.poll_guard.counts()["vllm_kv_events"] < POLLS and polls < 500:
                send_and_poll()  # the first messages are lost until the subscription reached the PUB
                polls += 1
        counts = agent.poll_guard.counts()
        assert counts["vllm_kv_events"] == POLLS
        assert counts["gpu"] == polls  # every poll made here
        assert counts["rings"] == counts["captures"] == counts["parquet"] == 0  # the others ran
        base = f"http://127.0.0.1:{agent.port}"
        assert httpx.get(base + "/health", timeout=5).status_code == 200
        samples = _samples(httpx.get(base + "/metrics", timeout=5).text)
        for source in ("gpu", "vllm_kv_events", "rings", "captures"):
            assert samples[f'infersight_agent_poll_failures_total{{source="{source}"}}'] == counts[source]
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.getMessage().startswith("poll:")]
        # once per kind, (gpu, RecursionError) and (vllm_kv_events, KeyError), however many polls met them
        assert sorted(r.getMessage().split(" failed")[0] for r in errors) == ["poll: gpu", "poll: vllm_kv_events"]
        assert all(r.exc_info is not None for r in errors)
        # fixed (the patches undone), the KV source decodes again: the bug cost only the messages it met
        monkeypatch.undo()
        for _ in range(50):
            send_and_poll()
            if agent.vllm_kv.stats()["events"]["BlockStored"]:
                break
        assert agent.vllm_kv.stats()["events"]["BlockStored"] >= 1
        assert agent.poll_guard.counts()["vllm_kv_events"] == POLLS
    finally:
        pub.close(linger=0)
        ctx.destroy(linger=0)
        agent.close()
