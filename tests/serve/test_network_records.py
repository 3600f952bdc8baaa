"""The server's probe records (SERVED, REQUEST_TEXT, NETWORK) and how the agent uses them: network
time in the decomposition, and rows held until the NETWORK record that follows FINISHED."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pandas as pd
import pytest
from serve_fixtures import MODEL, Harness

from infersight.agent import state as agent_state
from infersight.agent.config import AgentConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.state import AgentState
from infersight.correlate.frames import EventFrames, join_texts
from infersight.correlate.requests import request_table
from infersight.runtime import SamplingParams
from infersight.serve.config import ServeConfig

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def serve_two(h: Harness, **headers: str) -> list[Any]:
    async def go() -> list[Any]:
        async with h.client() as c:
            a = await c.post("/v1/completions", json={"prompt": "first", "max_tokens": 4, "ignore_eos": True,
                                                       "temperature": 0.5, "top_p": 0.9, "seed": 3},
                             headers={"traceparent": TRACEPARENT, "x-infersight-task": "code", **headers})
            b = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "second"}],
                                                            "max_tokens": 3, "stream": True, "ignore_eos": True,
                                                            "user": "alice"})
            return [a, b]
    resps = asyncio.run(go())
    assert all(r.status_code == 200 for r in resps)
    h.wait_idle()
    return resps


@pytest.fixture
def served() -> tuple[Harness, EventFrames]:
    with Harness(ServeConfig(model_name=MODEL)) as h:
        serve_two(h, **{"x-infersight-session-id": "s-1"})
        yield h, h.read_frames()


def test_records_of_served_requests(served: tuple[Harness, EventFrames]) -> None:
    _, frames = served
    net, srv = frames.network.set_index("request_id"), frames.served.set_index("request_id")
    assert sorted(net.index) == sorted(srv.index) == [0, 1]
    assert ((net["receive_ns"] <= net["first_byte_ns"]) & (net["first_byte_ns"] <= net["last_byte_ns"])).all()
    first, second = srv.loc[0], srv.loc[1]
    assert first["operation"] == "text_completion" and not first["stream"]
    assert first["remote_parent"] and first["parent_sampled"]
    assert int(first["parent_span_id"]) == int(TRACEPARENT.split("-")[2], 16)
    assert (first["temperature"], first["top_p"], first["seed"], first["max_tokens"]) == (0.5, 0.9, 3, 4)
    assert second["operation"] == "chat" and second["stream"] and not second["remote_parent"]
    texts = join_texts(frames.texts)
    assert texts[(0, "session_id")] == "s-1" and texts[(1, "user_id")] == "alice"
    assert not any(name in ("prompt", "completion") for _, name in texts)  # content stays in the server
    # The request event order the agent relies on: SERVED after ARRIVED, NETWORK after FINISHED.
    ev = frames.request_events
    for rid in (0, 1):
        finished = int(ev[(ev["request_id"] == rid) & (ev["event"] == "FINISHED")]["ts_ns"].iloc[0])
        assert net.loc[rid, "last_byte_ns"] >= finished


def test_network_time_fills_the_decomposition(served: tuple[Harness, EventFrames]) -> None:
    _, frames = served
    rows = request_table(frames.request_events, frames.network.rename(columns={"last_byte_ns": "send_end_ns"}))
    assert (rows["network_s"] > 0).all()  # its size is checked against the client's clock in test_serve_client_clock
    assert rows.set_index("request_id").loc[0, "trace_id"] == TRACEPARENT.split("-")[1]


def _without_network(frames: EventFrames) -> EventFrames:
    return dataclasses.replace(frames, network=EventFrames().network)


def test_agent_holds_served_rows_until_their_network_record(served: tuple[Harness, EventFrames]) -> None:
    _, frames = served
    seen: list[pd.DataFrame] = []
    state = AgentState(AgentConfig(rings=["x"],
                                   exposition=ExpositionConfig(model_name=MODEL)), on_rows=lambda rows, events: seen.append(rows))
    state.ingest(_without_network(frames))  # FINISHED read, NETWORK not yet written
    assert len(state.finished) == 0 and not seen
    state.ingest(EventFrames(network=frames.network))  # the next read brings it
    rows = pd.concat(seen)
    assert sorted(rows["request_id"]) == [0, 1] and (rows["network_s"] > 0).all()
    assert len(state.finished) == 2 and not state.awaiting_network and not state.network


def test_a_lost_network_record_releases_the_row_after_a_wait(served: tuple[Harness, EventFrames],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _, frames = served
    state = AgentState(AgentConfig(rings=["x"], exposition=ExpositionConfig(model_name=MODEL)))
    state.ingest(_without_network(frames))
    assert len(state.finished) == 0
    monkeypatch.setattr(agent_state, "NETWORK_WAIT_S", 0.0)
    state.ingest(EventFrames())
    assert len(state.finished) == 2 and all(r["network_s"] == 0 for r in state.finished)


def test_requests_not_served_over_http_are_not_held() -> None:
    with Harness(ServeConfig(model_name=MODEL)) as h:
        h.loop.stop()  # drive the engine from this thread instead
        h.engine.add_request("direct", SamplingParams(max_tokens=3, ignore_eos=True))
        while h.engine.has_unfinished():
            h.engine.step()
        state = AgentState(AgentConfig(rings=["x"], exposition=ExpositionConfig(model_name=MODEL)))
        state.ingest(h.read_frames())
        assert len(state.finished) == 1

