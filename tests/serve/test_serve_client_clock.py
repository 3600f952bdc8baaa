"""The request decomposition held against an independent clock: the OpenAI client's own.

Requests go over real TCP to `infersight serve`'s app on uvicorn, from an httpx client in this
process. time.monotonic_ns is one system-wide clock (CLOCK_MONOTONIC), so the client's send and
receive times compare directly with the engine's and the server's. One request uploads its body
slowly: half of it, a 300 ms pause, the rest. Checked:
  * the client's window contains the engine's (ARRIVED to FINISHED) and the server's (request received
    to last byte sent), so its e2e is at least theirs;
  * network time = client e2e - engine e2e within TOLERANCE_S, and the slow upload's pause is in it: a
    network part that missed the pause would be 1 s off. The gap is what one side sees and the other
    cannot: the client connecting, sending headers and parsing the response; the server noting its last
    byte once the write returns, which a busy machine can delay (seen: 0.4 s under a load of 19 on 2
    cores; 1-7 ms at a load of 14). The server's bounds get the same tolerance.
  * the agent names network as the slow upload's cause.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pandas as pd
import pytest
from serve_fixtures import MODEL, Harness, real_server

from infersight.agent.config import AgentConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.state import AgentState
from infersight.correlate.frames import EventFrames
from infersight.serve.config import ServeConfig

PAUSE_S = 1.0
TOLERANCE_S = 0.25
NORMAL = 10


def slow_body(body: bytes) -> Iterator[bytes]:
    yield body[: len(body) // 2]
    time.sleep(PAUSE_S)
    yield body[len(body) // 2:]


@pytest.fixture(scope="module")
def served() -> tuple[dict[int, tuple[int, int]], int, EventFrames]:
    """(request id -> client (send_ns, received_ns), the slow upload's id, the ring's frames)."""
    clock: dict[int, tuple[int, int]] = {}
    with Harness(ServeConfig(model_name=MODEL)) as h, real_server(h) as url, httpx.Client(base_url=url, timeout=30) as c:
        c.post("/v1/completions", json={"prompt": "warm up the connection", "max_tokens": 2})

        def send(content: bytes | Iterator[bytes]) -> int:
            start = time.monotonic_ns()
            resp = c.post("/v1/completions", content=content, headers={"content-type": "application/json"})
            resp.read()
            end = time.monotonic_ns()
            assert resp.status_code == 200, resp.text
            rid = int(resp.headers["x-infersight-request-id"])
            clock[rid] = (start, end)
            return rid

        for i in range(NORMAL):
            send(json.dumps({"prompt": f"request {i}", "max_tokens": 8, "ignore_eos": True}).encode())
        slow = send(slow_body(json.dumps({"prompt": "a slow upload", "max_tokens": 8, "ignore_eos": True}).encode()))
        h.wait_idle()
        frames, deadline = h.read_frames(), time.monotonic() + 10
        # The server writes a request's NETWORK record after its last byte: on a busy machine that
        # can come after wait_idle's grace period.
        while not set(clock) <= set(frames.network["request_id"]) and time.monotonic() < deadline:
            time.sleep(0.05)
            frames = frames.concat(h.read_frames())
    return clock, slow, frames


def agent_rows(frames: EventFrames) -> pd.DataFrame:
    state = AgentState(AgentConfig(rings=["unused"], exposition=ExpositionConfig(model_name=MODEL),
                                   slow=SlowRequestConfig(min_requests_for_p99=NORMAL)))
    state.ingest(frames)
    return pd.DataFrame(list(state.finished)).set_index("request_id")


def engine_times(frames: EventFrames) -> pd.DataFrame:
    ev = frames.request_events
    pick = lambda name: ev[ev["event"] == name].groupby("request_id")["ts_ns"].min()  # noqa: E731
    return pd.DataFrame({"arrived": pick("ARRIVED"), "finished": pick("FINISHED")})


def test_the_clients_e2e_contains_the_engines_and_the_servers(served) -> None:
    clock, _, frames = served
    engine, net = engine_times(frames), frames.network.set_index("request_id")
    rows = agent_rows(frames)
    for rid, (start, end) in clock.items():
        assert start <= net.loc[rid, "receive_ns"] <= engine.loc[rid, "arrived"]
        assert engine.loc[rid, "finished"] <= net.loc[rid, "last_byte_ns"] <= end + TOLERANCE_S * 1e9
        client_e2e, engine_e2e = (end - start) / 1e9, (engine.loc[rid, "finished"] - engine.loc[rid, "arrived"]) / 1e9
        assert client_e2e >= engine_e2e and client_e2e + TOLERANCE_S >= rows.loc[rid, "e2e_s"] >= engine_e2e


def test_network_time_is_client_minus_engine(served) -> None:
    clock, slow, frames = served
    engine, rows = engine_times(frames), agent_rows(frames)
    for rid, (start, end) in clock.items():
        unseen = (end - start) / 1e9 - (engine.loc[rid, "finished"] - engine.loc[rid, "arrived"]) / 1e9
        assert abs(unseen - rows.loc[rid, "network_s"]) <= TOLERANCE_S, (rid, unseen, rows.loc[rid, "network_s"])
    assert rows.loc[slow, "network_s"] >= PAUSE_S
    assert (rows.drop(index=slow)["network_s"] < PAUSE_S / 2).all()


def test_the_slow_upload_is_slow_from_the_network(served) -> None:
    _, slow, frames = served
    rows = agent_rows(frames)
    assert rows.loc[slow, "slow_cause"] == "network", rows[["e2e_s", "network_s", "slow_cause", "slow_detail"]]
    assert set(rows.index[rows["slow_cause"] != ""]) == {slow}, rows.loc[rows["slow_cause"] != "", "slow_detail"]
