"""The vLLM KV event subscriber against the publisher in kv_fake_vllm.py (vLLM 0.32's structs, PUB and
replay ROUTER, byte for byte); a payload encoded by vLLM 0.32 itself pins the format. No vLLM needed:
these run in the project venv. The sequencer's rules alone: test_vllm_kv_sequence.py.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pandas as pd
import pytest
from kv_fake_vllm import (
    VLLM_032_PAYLOAD, AllBlocksCleared, BlockRemoved, BlockStored, FakeVllm, KVEventBatch, h, pump, removed, stored,
)
from testkit import free_port

from infersight.agent.config import AgentConfig, ConfigError
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.sources.vllm.kv_config import VllmKvConfig
from infersight.agent.service import Agent
from infersight.sources.vllm import kv_wire as wire
from infersight.sources.vllm.kv_events import VllmKVEventsConfig, VllmKVSubscriber, subscriber_plan


@pytest.fixture
def link(request: pytest.FixtureRequest):
    """(subscriber, fake vLLM) on fresh loopback ports; params: dict of VllmKVEventsConfig overrides,
    plus replay=False for none and buffer_steps for vLLM's replay buffer."""
    opts = dict(getattr(request, "param", {}))
    with_replay, buffer_steps = opts.pop("replay", True), opts.pop("buffer_steps", 10_000)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}" if with_replay else None
    sub = VllmKVSubscriber(VllmKVEventsConfig(endpoint, replay, **opts), wall_anchor=lambda: (0, 0))
    fake = FakeVllm(endpoint, replay, sub, buffer_steps=buffer_steps)
    yield sub, fake
    sub.close()
    fake.close()


# -- decoding -------------------------------------------------------------------------------------
def test_the_structs_here_encode_exactly_as_vllm_032_and_the_payload_decodes() -> None:
    ours = msgspec.msgpack.encode(KVEventBatch(ts=1700000000.25, events=[
        BlockStored(block_hashes=[bytes(range(32)), 7], parent_block_hash=None, token_ids=[1, 2, 3], block_size=32,
                    lora_id=None, medium="GPU", lora_name=None, group_idx=0, session_id="abc"),
        BlockRemoved(block_hashes=[bytes(range(32))], medium="GPU", group_idx=0), AllBlocksCleared()],
        data_parallel_rank=0))
    assert ours == VLLM_032_PAYLOAD
    batch = wire.decode_message([b"kv", (41).to_bytes(8, "big"), VLLM_032_PAYLOAD], b"kv", 1 << 20)
    assert (batch.seq, batch.ts, batch.dp_rank, batch.dropped) == (41, 1700000000.25, 0, {})
    assert [type(e).__name__ for e in batch.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert batch.events[0].session_id == "abc" and batch.events[0].block_size == 32
    # The uint64 of a bytes hash is its last 8 bytes, big-endian (vLLM's own int conversion).
    assert wire.hash64(bytes(range(32))) == int.from_bytes(bytes(range(24, 32)), "big") == 0x18191A1B1C1D1E1F
    assert wire.hash64(7) == 7 and wire.hash64(-1) == 2**64 - 1


@pytest.mark.parametrize("parts,reason", [
    ([b"kv", bytes(8)], "frame_count"),
    ([b"kv", bytes(8), b"", b""], "frame_count"),
    ([b"other", bytes(8), b"\x90"], "topic"),
    ([b"kv", bytes(7), b"\x90"], "sequence"),
    ([b"kv", bytes(8), b"\x93" + bytes(40)], "too_large"),
    ([b"kv", bytes(8), b"\xc1\xc1"], "payload"),
    ([b"kv", bytes(8), msgspec.msgpack.encode({"ts": 1.0})], "payload"),
    ([b"kv", bytes(8), msgspec.msgpack.encode([float("inf"), [], 0])], "payload"),
])
def test_malformed_messages_say_why(parts: list[bytes], reason: str) -> None:
    with pytest.raises(wire.Malformed) as err:
        wire.decode_message(parts, b"kv", 32)
    assert err.value.reason == reason


def test_bad_events_are_dropped_one_by_one() -> None:
    payload = msgspec.msgpack.encode([5.0, [{"type": "BlockStored", "block_hashes": [1]},
                                            {"type": "BlockPinned", "block_hashes": [2]},
                                            {"type": "BlockRemoved", "block_hashes": "nope"}, 17,
                                            {"type": "BlockRemoved", "block_hashes": [bytes(65)]}], 0])
    batch = wire.decode_payload(3, payload)
    assert [type(e).__name__ for e in batch.events] == ["BlockStored"]
    assert batch.dropped == {"unknown_event": 1, "event_fields": 3}


def test_the_side_that_binds_follows_vllms_rule() -> None:
    assert subscriber_plan("tcp://127.0.0.1:5557") == ("bind", "tcp://127.0.0.1:5557")
    assert subscriber_plan("tcp://*:5557") == ("connect", "tcp://127.0.0.1:5557")
    assert subscriber_plan("tcp://[::]:5557") == ("connect", "tcp://[::1]:5557")
    for bad in ("127.0.0.1:5557", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://h:99999", "udp://h:1"):
        with pytest.raises(ValueError):
            VllmKVEventsConfig(bad)


# -- the stream -----------------------------------------------------------------------------------
def test_exact_rows_ids_and_timestamps(link) -> None:
    sub, fake = link
    fake.publish(stored(1, 2, 3), ts=1000.5)
    fake.publish(removed(1), stored(4, session="req-1"), ts=1001.0)
    fake.publish(stored(1), ts=1002.0)  # 1 was evicted: computed again
    fake.publish(AllBlocksCleared(), ts=1003.0)
    rows = pump(sub, fake, lambda r: len(r) >= 11)
    from infersight.vllm.ids import join_key
    req = join_key("req-1")
    assert list(rows.itertuples(index=False, name=None)) == [
        (1000500000000, "cached", 0, -1, 1), (1000500000000, "cached", 1, -1, 2), (1000500000000, "cached", 2, -1, 3),
        (1001000000000, "evicted", 0, -1, 1), (1001000000000, "cached", 3, req, 4),
        (1002000000000, "recomputed", 0, -1, 1), (1002000000000, "cached", 0, -1, 1),
        # the clear evicts what is cached: 2, 3, 4 and the re-cached 1, with their ids
        (1003000000000, "evicted", 1, -1, 2), (1003000000000, "evicted", 2, -1, 3),
        (1003000000000, "evicted", 3, -1, 4), (1003000000000, "evicted", 0, -1, 1)]
    assert rows.dtypes.to_dict() == {"ts_ns": "int64", "event": "object", "block_id": "int64", "request_id": "int64",
                                     "block_hash": "uint64"}
    s = sub.stats()
    assert s["batches"] == 4 and s["gaps"] == 0 and s["replayed"] == 0 and sum(s["lost"].values()) == 0
    assert s["events"] == {"BlockStored": 3, "BlockRemoved": 1, "AllBlocksCleared": 1}
    assert s["cached_blocks"] == 0 and sum(s["malformed"].values()) == 0


def test_timestamps_follow_the_agents_wall_anchor() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    anchor = [(2_000_000_000_000, 5_000)]  # wall 2000 s was monotonic 5 us
    sub = VllmKVSubscriber(VllmKVEventsConfig(endpoint), wall_anchor=lambda: anchor[0])
    fake = FakeVllm(endpoint, None, sub)
    try:
        fake.publish(stored(7), ts=2001.25)
        rows = pump(sub, fake, lambda r: len(r) >= 1)
        assert rows["ts_ns"].tolist() == [1_250_000_000 + 5_000]
    finally:
        sub.close()
        fake.close()


@pytest.mark.parametrize("link", [{"max_messages_per_poll": 3}], indirect=True)
def test_each_poll_reads_a_bounded_number_of_messages(link) -> None:
    sub, fake = link
    for i in range(7):
        fake.publish(stored(i))
    time.sleep(0.3)  # all seven are queued at the subscriber
    assert [len(sub.poll()) for _ in range(4)] == [3, 3, 1, 0]


def test_a_gap_is_replayed_and_applied_in_sequence_order(link) -> None:
    sub, fake = link
    fake.publish(stored(1))
    fake.publish(stored(2), send=False)
    fake.publish(stored(3), send=False)
    fake.publish(stored(4))
    rows = pump(sub, fake, lambda r: len(r) >= 4)
    assert rows["block_hash"].tolist() == [1, 2, 3, 4]
    s = sub.stats()
    assert (s["batches"], s["gaps"], s["replayed"], s["replay_requests"]) == (4, 1, 2, 1)
    assert sum(s["lost"].values()) == 0


def test_gaps_that_outrun_each_replay_answer_are_asked_for_again(link) -> None:
    """vLLM answers with what it had published when it answered; here each answer reaches the agent
    only after the next gap's live successor (a slow round trip, a gap every few batches). Three
    rounds in a row: every withheld batch comes back, none is counted lost."""
    sub, fake = link
    frames = []

    def answer_once() -> None:
        deadline = time.monotonic() + 5
        while not fake.serve_replay():
            assert time.monotonic() < deadline, "no replay request came"
            frames.append(sub.poll())  # the poll that sees the gap sends the request
            time.sleep(0.01)

    fake.publish(stored(0))
    fake.publish(stored(1), send=False)
    fake.publish(stored(2))
    for first in (3, 6):  # answer, then the next gap arrives before the agent reads the answer
        answer_once()
        fake.publish(stored(first))
        fake.publish(stored(first + 1), send=False)
        fake.publish(stored(first + 2))
        time.sleep(0.2)  # the live batches and the answer are all queued at the agent
        frames.append(sub.poll())  # live first, then the answer: its end marker finds the gap beyond it
    frames.append(pump(sub, fake, lambda r: len(r) >= 9 - sum(map(len, frames))))
    assert pd.concat(frames, ignore_index=True)["block_hash"].tolist() == list(range(9))
    s = sub.stats()
    assert (s["batches"], s["gaps"], s["replayed"], s["replay_requests"]) == (9, 3, 3, 3)
    assert sum(s["lost"].values()) == 0


@pytest.mark.parametrize("link", [{"buffer_steps": 2}], indirect=True)
def test_a_gap_older_than_vllms_buffer_is_counted_lost(link) -> None:
    sub, fake = link
    fake.publish(stored(10))
    for i in range(11, 15):
        fake.publish(stored(i), send=False)
    fake.publish(stored(15))  # vLLM's buffer now holds only 14 and 15
    rows = pump(sub, fake, lambda r: len(r) >= 3)
    assert rows["block_hash"].tolist() == [10, 14, 15]
    s = sub.stats()
    assert (s["gaps"], s["replayed"], s["lost"]["not_buffered"], sum(s["lost"].values())) == (1, 1, 3, 3)


@pytest.mark.parametrize("link", [{"replay_timeout_s": 0.3}], indirect=True)
def test_a_replay_endpoint_that_never_answers_costs_a_bounded_wait(link) -> None:
    sub, fake = link
    fake.publish(stored(1))
    fake.publish(stored(2), send=False)
    fake.publish(stored(3))
    start = time.monotonic()
    rows = pump(sub, fake, lambda r: len(r) >= 2, answer=False)
    waited = time.monotonic() - start
    assert rows["block_hash"].tolist() == [1, 3] and 0.25 <= waited < 2.0
    assert sub.stats()["lost"]["timeout"] == 1
    # The next gap gets a fresh replay socket: the old, unanswered request does not confuse it.
    fake.publish(stored(4))
    fake.publish(stored(5), send=False)
    fake.publish(stored(6))
    rows = pump(sub, fake, lambda r: len(r) >= 3)
    s = sub.stats()
    assert rows["block_hash"].tolist() == [4, 5, 6]
    assert (s["gaps"], s["replayed"], s["lost"]["timeout"], sum(s["lost"].values())) == (2, 1, 1, 1)


@pytest.mark.parametrize("link", [{"replay": False}], indirect=True)
def test_without_a_replay_endpoint_a_gap_is_lost_at_once(link) -> None:
    sub, fake = link
    fake.publish(stored(1))
    fake.publish(stored(2), send=False)
    fake.publish(stored(3))
    rows = pump(sub, fake, lambda r: len(r) >= 2)
    assert rows["block_hash"].tolist() == [1, 3]
    s = sub.stats()
    assert (s["gaps"], s["lost"]["no_replay"], s["replay_requests"]) == (1, 1, 0)


@pytest.mark.parametrize("link", [{"max_payload_bytes": 4096}], indirect=True)
def test_garbled_frames_are_counted_and_the_stream_goes_on(link, caplog: pytest.LogCaptureFixture) -> None:
    sub, fake = link
    fake.publish(stored(1))
    fake.send_raw(b"kv", (1).to_bytes(8, "big"), b"\xc1 not msgpack")        # seq 1: garbled payload
    fake.send_raw(b"kv", (1).to_bytes(8, "big"))                             # two frames
    fake.send_raw(b"other", (9).to_bytes(8, "big"), b"\x90")                 # another topic
    fake.send_raw(b"kv", b"\x01\x02\x03", b"\x90")                           # a 3-byte sequence number
    unknown = msgspec.msgpack.encode([1000.0, [{"type": "BlockPinned", "block_hashes": [h(5)]},
                                               msgspec.to_builtins(stored(2), builtin_types=(bytes,))], 0])
    fake.send_raw(b"kv", (2).to_bytes(8, "big"), unknown)                    # seq 2: one event unknown
    fake.send_raw(b"kv", (3).to_bytes(8, "big"), b"\x93" + bytes(5000))      # seq 3: over the size limit
    fake.send_raw(b"kv", (4).to_bytes(8, "big"), msgspec.msgpack.encode(KVEventBatch(1000.0, [stored(3)], 0)))
    with caplog.at_level("WARNING", logger="infersight.agent"):
        rows = pump(sub, fake, lambda r: len(r) >= 3)
        sub.poll()
    assert rows["block_hash"].tolist() == [1, 2, 3]
    s = sub.stats()
    assert s["malformed"] == {"frame_count": 1, "topic": 1, "sequence": 1, "too_large": 1, "payload": 1,
                              "unknown_event": 1, "event_fields": 0}
    # The garbled and oversized batches kept their place: no gap, nothing asked for, nothing lost.
    assert (s["batches"], s["gaps"], s["replay_requests"], sum(s["lost"].values())) == (5, 0, 0, 0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6 and all("\n" not in line for line in lines)


def test_a_publisher_restart_is_a_new_epoch_not_a_gap_storm(link) -> None:
    sub, fake = link
    fake.publish(stored(1, 2))
    fake.publish(removed(1))
    fake.publish(stored(3))
    pump(sub, fake, lambda r: len(r) >= 4)
    fake.stop()
    fake.start()  # vLLM restarted: sequence numbers from 0, an empty cache
    fake.publish(stored(9), send=False)  # lost before the new publisher's connection was up
    fake.publish(stored(10))
    rows = pump(sub, fake, lambda r: len(r) >= 4)
    assert list(zip(rows["event"], rows["block_hash"])) == [("evicted", 2), ("evicted", 3), ("cached", 9),
                                                            ("cached", 10)]
    s = sub.stats()
    assert (s["restarts"], s["gaps"], s["replayed"], sum(s["lost"].values())) == (1, 0, 1, 0)
    assert s["batches"] == 5 and s["cached_blocks"] == 2


@pytest.mark.parametrize("link,lost", [({}, 0), ({"buffer_steps": 1}, 2)], indirect=["link"])
def test_batches_published_before_the_agent_joined_are_replayed_or_counted(link, lost: int) -> None:
    sub, fake = link
    fake.publish(stored(1), send=False)
    fake.publish(stored(2), send=False)
    fake.publish(stored(3))
    rows = pump(sub, fake, lambda r: len(r) >= 3 - lost, timeout_s=3.0)
    s = sub.stats()
    assert rows["block_hash"].tolist() == [1, 2, 3][lost:]
    assert (s["gaps"], s["replayed"], s["lost"]["late_join"]) == (0, 2 - lost, lost)


# -- inside the agent -----------------------------------------------------------------------------
def _without_model_name(key: str) -> str:
    key = re.sub(r',?model_name="[^"]*"', "", key).replace("{,", "{")
    return key.replace("{}", "")


def test_the_agent_serves_the_translated_events_and_keeps_serving_through_garbage(tmp_path) -> None:
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    agent = Agent(AgentConfig(port=0, captures=CaptureConfig(token_file=str(tmp_path / "token")),
                              gpu=GpuConfig(source="none"), vllm_kv=VllmKvConfig(events=endpoint, replay=replay)))
    fake = FakeVllm(endpoint, replay, agent.vllm_kv)
    try:
        agent.start_http()
        base = f"http://127.0.0.1:{agent.port}"
        fake.publish(stored(1, 2, 3), ts=time.time())
        fake.publish(removed(2), ts=time.time() + 0.5)
        fake.publish(stored(4), send=False)
        for _ in range(200):
            fake.send_raw(b"kv", b"\x00", b"\xc1")
        fake.publish(stored(5), ts=time.time() + 1.0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and agent.vllm_kv.stats()["batches"] < 4:
            agent.poll_once()
            fake.serve_replay()
            assert httpx.get(base + "/health", timeout=2).status_code == 200
        text = httpx.get(base + "/metrics", timeout=5).text
        # model_name: the identity label on every engine family (one value per agent, 2eaec1a), not a
        # split; dropped from the keys so they name what is counted.
        samples = {_without_model_name(line.rsplit(" ", 1)[0]): float(line.rsplit(" ", 1)[1])
                   for line in text.splitlines() if line and not line.startswith("#")}
        assert samples['infersight_kv_block_events_total{event="cached"}'] == 5
        assert samples['infersight_kv_block_events_total{event="evicted"}'] == 1
        assert samples['infersight_vllm_kv_events_total{type="BlockStored"}'] == 3
        assert samples['infersight_vllm_kv_malformed_total{reason="sequence"}'] == 200
        assert samples["infersight_vllm_kv_replayed_total"] == 1 and samples["infersight_vllm_kv_gaps_total"] == 1
        assert samples["infersight_vllm_kv_cached_blocks"] == 4
        assert samples['infersight_kv_block_age_seconds_count{kind="idle_before_evict"}'] == 1
    finally:
        agent.close()
        fake.close()


def test_a_busy_or_bad_endpoint_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="tcp://HOST:PORT"):
        AgentConfig(vllm_kv=VllmKvConfig(events="localhost:5557"))
    with pytest.raises(ConfigError, match="needs --vllm-kv-events"):
        AgentConfig(rings=["x"], vllm_kv=VllmKvConfig(replay="tcp://127.0.0.1:5558"))
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    holder = VllmKVSubscriber(VllmKVEventsConfig(endpoint))
    try:
        with pytest.raises(ConfigError, match="cannot bind"):
            Agent(AgentConfig(port=0, captures=CaptureConfig(token_file=str(tmp_path / "token")),
                              gpu=GpuConfig(source="none"), vllm_kv=VllmKvConfig(events=endpoint)))
    finally:
        holder.close()


def test_the_cli_refuses_a_bad_or_busy_endpoint_in_one_line() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    holder = VllmKVSubscriber(VllmKVEventsConfig(endpoint))
    try:
        for args, needle in ((["--vllm-kv-events", "127.0.0.1:5557"], "tcp://HOST:PORT"),
                             (["--vllm-kv-events", endpoint, "--listen", f"127.0.0.1:{free_port()}"], "cannot bind")):
            res = subprocess.run([sys.executable, "-m", "infersight", "agent", *args], capture_output=True, text=True,
                                 timeout=60, cwd=Path(__file__).resolve().parents[2])
            assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
            lines = [line for line in res.stderr.splitlines() if "infersight: error:" in line]
            assert len(lines) == 1 and needle in lines[0], res.stderr
    finally:
        holder.close()


def test_the_replay_timeout_flag_reaches_the_sequencer_and_a_bad_one_is_one_line(tmp_path) -> None:
    with pytest.raises(ConfigError, match="--vllm-kv-replay-timeout must be between 0.01 and 60 s"):
        AgentConfig(vllm_kv=VllmKvConfig(events=f"tcp://127.0.0.1:{free_port()}", replay_timeout_s=0))
    agent = Agent(AgentConfig(port=0, captures=CaptureConfig(token_file=str(tmp_path / "token")),
                              gpu=GpuConfig(source="none"),
                              vllm_kv=VllmKvConfig(events=f"tcp://127.0.0.1:{free_port()}", replay_timeout_s=7.5)))
    try:
        assert agent.vllm_kv.seq.timeout_s == 7.5
    finally:
        agent.close()
    assert AgentConfig(rings=["x"]).vllm_kv.replay_timeout_s == VllmKVEventsConfig("tcp://127.0.0.1:1").replay_timeout_s
    for value in ("0", "61", "soon"):
        res = subprocess.run([sys.executable, "-m", "infersight", "agent", "--vllm-kv-events",
                              f"tcp://127.0.0.1:{free_port()}", "--vllm-kv-replay-timeout", value],
                             capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
        lines = [line for line in res.stderr.splitlines() if "error:" in line]
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert len(lines) == 1 and "--vllm-kv-replay-timeout" in lines[0], res.stderr
