"""vLLM KV-event ZMQ messages: seeded mutations of payloads vLLM 0.32 encodes (the pinned payload of
tests/vllm/kv_fake_vllm.py and batches built with its copies of vLLM's structs) go through the
subscriber's own receive path (`_on_live`, then `poll`) and end as events or counted drops: the
listener never raises, and every case is counted somewhere (events, malformed, or an empty batch).

A second, structure-aware set builds payloads at the limits instead of mutating bytes: arrays and maps
nested from 10 to 100,000 deep at every place a value may sit (the whole payload, an event, a known or
an unknown event field, a hash, a batch field), list and string headers that claim counts and lengths
at, just over and far over the decoder's bounds (with the body present or cut short), and odd
timestamps; each goes through the same listener."""
from __future__ import annotations

import importlib.util
import random
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import msgspec
import pytest
from fuzzkit import case_count, describe, fuzz, mutations
from testkit import free_port

from infersight.sources.vllm import kv_wire as wire
from infersight.sources.vllm.kv_events import VllmKVEventsConfig, VllmKVSubscriber

SEED = 1706
VLLM_STRUCTS = Path(__file__).resolve().parents[1] / "vllm" / "kv_fake_vllm.py"


def _vllm_structs() -> ModuleType:
    """tests/vllm/kv_fake_vllm.py, loaded by path (it holds vLLM 0.32's structs, field for field; loaded
    by path so that this file runs alone, without tests/vllm on the import path)."""
    spec = importlib.util.spec_from_file_location("kv_events_vllm_structs", VLLM_STRUCTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _seeds() -> list[bytes]:
    v = _vllm_structs()
    enc = msgspec.msgpack.Encoder()
    int_hashes = v.BlockStored(block_hashes=[11, 12, 13], parent_block_hash=10, token_ids=list(range(48)),
                               block_size=16, lora_id=None, medium="GPU", lora_name=None, group_idx=1)
    return [v.VLLM_032_PAYLOAD,
            enc.encode(v.KVEventBatch(ts=1700000001.5, events=[v.stored(1, 2, 3), v.removed(2), int_hashes])),
            enc.encode(v.KVEventBatch(ts=1700000002.0, events=[v.AllBlocksCleared(), v.stored(4)], data_parallel_rank=1))]


def _listener() -> Callable[[bytes], Any]:
    """decode(payload): one live message through a real subscriber, created in the fuzz child (a ZMQ
    context must not cross a fork), then a poll; asserts the case was counted."""
    state: dict[str, Any] = {}

    def decode(payload: bytes) -> Any:
        if "sub" not in state:
            state["sub"] = VllmKVSubscriber(VllmKVEventsConfig(f"tcp://127.0.0.1:{free_port()}", topic=""))
            state["seq"] = 0
        sub: VllmKVSubscriber = state["sub"]
        before = sum(sub.malformed.values()) + sum(sub.events.values())
        sub._on_live([b"", state["seq"].to_bytes(8, "big"), payload], time.monotonic())
        state["seq"] += 1
        rows = sub.poll()
        counted = sum(sub.malformed.values()) + sum(sub.events.values()) - before
        assert counted > 0 or _empty_batch(payload), "a message was neither decoded nor counted as dropped"
        return rows
    return decode


def _empty_batch(payload: bytes) -> bool:
    try:
        return not wire.decode_payload(0, payload).events
    except wire.Malformed:
        return False


def test_fuzz_kv_event_payloads() -> None:
    seeds = _seeds()
    for payload in seeds:  # the seeds decode, with every event
        assert wire.decode_payload(0, payload).events and not wire.decode_payload(0, payload).dropped
    failures = fuzz(_listener(), mutations(seeds, case_count(300), SEED), allowed=(), per_case_s=5.0)
    assert not failures, describe(failures)


DEPTHS = (10, 100, 900, 990, 1000, 1010, 2000, 5000, 20_000, 100_000)


def _nest(depth: int, kind: int) -> bytes:
    """A value `depth` containers deep, around a nil: fixarray, array16, fixmap (str key) or map32."""
    head = (b"\x91", b"\xdc\x00\x01", b"\x81\xa1k", b"\xdf\x00\x00\x00\x01\xa1k")[kind]
    return head * depth + b"\xc0"


def _map(fields: list[tuple[str, bytes]]) -> bytes:
    out = bytes([0x80 | len(fields)])
    for key, value in fields:
        out += msgspec.msgpack.encode(key) + value
    return out


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


def _batch(events: list[bytes], ts: bytes = msgspec.msgpack.encode(1000.0), tail: bytes = b"\x00") -> bytes:
    return b"\x93" + ts + _array_header(len(events)) + b"".join(events) + tail


_TYPE = [("type", msgspec.msgpack.encode("BlockStored"))]
_HASHES = msgspec.msgpack.encode([1, 2])


def structured_case(rng: random.Random) -> bytes:
    """One payload at a limit: deep nesting somewhere, a count or length at a bound, or an odd ts."""
    shape = rng.randrange(4)
    if shape <= 1:  # nesting, at one of the places a value may sit
        deep = _nest(rng.choice(DEPTHS), rng.randrange(4))
        place = rng.randrange(7)
        if place == 0:
            return deep
        if place == 1:
            return _batch([deep])
        if place == 2:  # an unknown field, which msgspec skips
            return _batch([_map(_TYPE + [("block_hashes", _HASHES), ("extra_keys", deep)])])
        if place == 3:  # a known field of the wrong kind
            return _batch([_map(_TYPE + [("block_hashes", deep)])])
        if place == 4:  # a hash
            return _batch([_map(_TYPE + [("block_hashes", b"\x92\x01" + deep)])])
        if place == 5:
            return b"\x94" + msgspec.msgpack.encode(1000.0) + b"\x90\x00" + deep  # a fourth batch field
        return _batch([], tail=deep)  # the dp rank
    if shape == 2:  # counts and lengths at, over and far over the bounds, the body present or cut short
        bound = rng.choice((wire.MAX_EVENTS_PER_BATCH, wire.MAX_HASHES_PER_EVENT, wire.MAX_HASH_BYTES,
                            wire.MAX_SESSION_ID_CHARS))
        n = rng.choice((bound - 1, bound, bound + 1, 2 * bound, (1 << 32) - 1))
        cut = rng.random() < 0.5
        what = rng.randrange(4)
        if what == 0:  # events
            body = b"" if cut or n > 1 << 18 else b"\x81\xa4type\xb0AllBlocksCleared" * n
            return b"\x93" + msgspec.msgpack.encode(1000.0) + _array_header(n) + body
        if what == 1:  # hashes of one event
            body = b"" if cut or n > 1 << 18 else b"\x01" * n
            return _batch([_map(_TYPE + [("block_hashes", _array_header(n) + body)])])
        length = min(n, 1 << 20)
        data = b"" if cut else b"x" * length
        if what == 2:  # a bytes hash of that length
            head = b"\xc6" + n.to_bytes(4, "big")
            return _batch([_map(_TYPE + [("block_hashes", b"\x91" + head + data)])])
        head = b"\xdb" + n.to_bytes(4, "big")  # a session id of that length
        return _batch([_map(_TYPE + [("block_hashes", _HASHES), ("session_id", head + data)])])
    ts = rng.choice((b"\xcb\x7f\xf0" + bytes(6), b"\xcb\xff\xf8" + bytes(6), b"\xcf" + b"\xff" * 8,
                     b"\xd3\x80" + bytes(7), msgspec.msgpack.encode(4e9), msgspec.msgpack.encode(-4e9 - 1),
                     b"\xc0", _nest(rng.choice(DEPTHS), 0)))
    return _batch([_map(_TYPE + [("block_hashes", _HASHES)])], ts=ts)


def test_fuzz_kv_event_payloads_at_their_limits() -> None:
    rng = random.Random(SEED + 1)
    cases = [structured_case(rng) for _ in range(case_count(300))]
    failures = fuzz(_listener(), cases, allowed=(), per_case_s=5.0)
    assert not failures, describe(failures)


@pytest.mark.parametrize("ts", [1e300, -1e300, float("inf"), float("nan"), 5e9])
def test_regression_timestamp_no_int64_can_hold(ts: float) -> None:
    # 1e300 is finite but ts * 1e9 overflowed int() in the subscriber's poll
    payload = msgspec.msgpack.encode([ts, [], None])
    with pytest.raises(wire.Malformed, match="timestamp"):
        wire.decode_payload(3, payload)


def test_malformed_frames_are_counted_drops() -> None:
    sub = VllmKVSubscriber(VllmKVEventsConfig(f"tcp://127.0.0.1:{free_port()}", topic=""))
    try:
        now = time.monotonic()
        sub._on_live([b"", (0).to_bytes(8, "big")], now)  # two frames
        sub._on_live([b"", b"\x00" * 7, b"\x90"], now)  # a 7-byte sequence
        sub._on_live([b"", (1).to_bytes(8, "big"), b"\xc1"], now)  # 0xc1 is never valid msgpack
        sub._on_live([b"", (2).to_bytes(8, "big"), msgspec.msgpack.encode([1.0, [], 1 << 20])], now)  # dp rank
        sub.poll()
        assert sub.malformed["frame_count"] == 1 and sub.malformed["sequence"] == 1
        assert sub.malformed["payload"] == 2
    finally:
        sub.close()
