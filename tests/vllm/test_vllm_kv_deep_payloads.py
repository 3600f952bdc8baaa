"""A vLLM KV-event message nested deeper than any decoder recurses (issue 33 item 1): msgspec skips an
unknown value, or an event it holds raw, by recursion, so arrays nested ~5,000 deep raised a
RecursionError that left the subscriber's poll and ended the agent. Each such message must be one
counted, logged drop, on the live path and on the replay path alike, and the stream goes on in order.

Expected counts come from the messages the test sends (one drop per deep message, every other batch
applied), not from the decoder."""
from __future__ import annotations

import time

import msgspec
import pytest
from kv_fake_vllm import KVEventBatch, pump, stored
from testkit import free_port

from infersight.sources.vllm import kv_wire as wire
from infersight.sources.vllm.kv_events import VllmKVEventsConfig, VllmKVSubscriber

DEPTH = 5000  # the attack's depth; far beyond the interpreter's recursion limit (1,000 by default)


def deep_array(depth: int = DEPTH) -> bytes:
    """msgpack: `depth` one-element arrays around a nil, written by hand (an encoder would recurse)."""
    return b"\x91" * depth + b"\xc0"


def raw_map(**fields: bytes) -> bytes:
    """A msgpack map of str keys to values already encoded (fewer than 16 fields)."""
    out = bytes([0x80 | len(fields)])
    for key, value in fields.items():
        out += msgspec.msgpack.encode(key) + value
    return out


TS = msgspec.msgpack.encode(1000.0)
GOOD_EVENT = msgspec.msgpack.encode(msgspec.to_builtins(stored(7), builtin_types=(bytes,)))

#: name -> a payload with the deep value at one place; whether the batch survives with one event dropped.
PAYLOADS = {
    "as an event": (b"\x93" + TS + b"\x92" + GOOD_EVENT + deep_array() + b"\x00", "payload"),
    "as a fourth batch field": (b"\x94" + TS + b"\x90\x00" + deep_array(), "payload"),
    "as the dp rank": (b"\x93" + TS + b"\x90" + deep_array(), "payload"),
    "in an unknown event field": (b"\x93" + TS + b"\x92" + GOOD_EVENT + raw_map(
        type=msgspec.msgpack.encode("AllBlocksCleared"), extra_keys=deep_array()) + b"\x00", "payload"),
    "as the whole payload": (deep_array(), "payload"),
}


@pytest.mark.parametrize("where", sorted(PAYLOADS))
def test_a_deep_payload_is_malformed_not_a_recursion_error(where: str) -> None:
    payload, reason = PAYLOADS[where]
    with pytest.raises(wire.Malformed) as info:
        wire.decode_payload(9, payload)
    assert info.value.reason == reason and info.value.seq == 9  # its place in the stream is kept


def test_the_same_nesting_within_the_interpreters_reach_still_decodes() -> None:
    """The guard is on depth, not on shape: an unknown field nested 20 deep is skipped as vLLM's
    future fields are, and the event around it is kept."""
    payload = b"\x93" + TS + b"\x91" + raw_map(type=msgspec.msgpack.encode("AllBlocksCleared"),
                                               extra_keys=deep_array(20)) + b"\x00"
    batch = wire.decode_payload(1, payload)
    assert [type(e).__name__ for e in batch.events] == ["AllBlocksCleared"] and not batch.dropped


@pytest.fixture
def sub() -> VllmKVSubscriber:
    s = VllmKVSubscriber(VllmKVEventsConfig(f"tcp://127.0.0.1:{free_port()}", topic="kv"),
                         wall_anchor=lambda: (0, 0))
    yield s
    s.close()


def test_every_deep_live_message_is_one_counted_drop_and_the_stream_goes_on(sub: VllmKVSubscriber,
                                                                               caplog: pytest.LogCaptureFixture) -> None:
    now = time.monotonic()
    seq = 0
    for payload, _ in PAYLOADS.values():
        sub._on_live([b"kv", seq.to_bytes(8, "big"), payload], now)
        seq += 1
    good = msgspec.msgpack.encode(KVEventBatch(1000.0, [stored(1)], 0))
    sub._on_live([b"kv", seq.to_bytes(8, "big"), good], now)
    with caplog.at_level("WARNING", logger="infersight.agent"):
        rows = sub.poll()
    s = sub.stats()
    assert s["malformed"]["payload"] == len(PAYLOADS)
    assert rows["block_hash"].tolist() == [1]
    # The dropped batches kept their places: no gap, nothing lost, every sequence number applied.
    assert (s["batches"], s["gaps"], sum(s["lost"].values())) == (len(PAYLOADS) + 1, 0, 0)
    assert any("dropped a message" in r.getMessage() for r in caplog.records)


def test_a_deep_replayed_message_is_a_counted_drop() -> None:
    """The replay path decodes with the same code: a hole answered with a deep payload is a drop."""
    from kv_fake_vllm import FakeVllm

    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    sub = VllmKVSubscriber(VllmKVEventsConfig(endpoint, replay), wall_anchor=lambda: (0, 0))
    fake = FakeVllm(endpoint, replay, sub)
    try:
        fake.publish(stored(1))
        fake.buffer.append((fake.seq, PAYLOADS["as an event"][0]))  # published, lost in transit: replayed
        fake.seq += 1
        fake.publish(stored(3))
        rows = pump(sub, fake, lambda r: len(r) >= 2 and sub.stats()["replayed"] >= 1)
        s = sub.stats()
        assert rows["block_hash"].tolist() == [1, 3]
        assert (s["malformed"]["payload"], s["gaps"], s["replayed"], sum(s["lost"].values())) == (1, 1, 1, 0)
    finally:
        sub.close()
        fake.close()


class _Broken:
    """A decoder that raises what msgspec never documents (a stand-in for a future decoder bug)."""

    def decode(self, data: object) -> None:
        raise IndexError("a decoder bug")


def test_any_exception_from_decoding_is_the_messages_or_the_events_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    good = msgspec.msgpack.encode(KVEventBatch(1000.0, [stored(1), stored(2)], 0))
    monkeypatch.setattr(wire, "_EVENT", _Broken())
    batch = wire.decode_payload(4, good)
    assert batch.events == [] and batch.dropped == {"event_fields": 2}
    assert batch.errors["event_fields"] == "IndexError: a decoder bug"
    monkeypatch.setattr(wire, "_BATCH", _Broken())
    with pytest.raises(wire.Malformed) as info:
        wire.decode_payload(5, good)
    assert (info.value.reason, info.value.seq) == ("payload", 5) and "IndexError" in str(info.value)
