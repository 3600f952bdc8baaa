"""vLLM KV-event ZMQ messages: seeded mutations of payloads vLLM 0.32 encodes (the pinned payload of
tests/vllm/test_vllm_kv_events.py and batches built with its copies of vLLM's structs) go through the
subscriber's own receive path (`_on_live`, then `poll`) and end as events or counted drops: the
listener never raises, and every case is counted somewhere (events, malformed, or an empty batch)."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import msgspec
import pytest
from fuzzkit import case_count, describe, fuzz, mutations
from testkit import free_port

from infersight.sources import vllm_kv_wire as wire
from infersight.sources.vllm_kv_events import VllmKVEventsConfig, VllmKVSubscriber

SEED = 1706
VLLM_TESTS = Path(__file__).resolve().parents[1] / "vllm" / "test_vllm_kv_events.py"


def _vllm_structs() -> ModuleType:
    """tests/vllm/test_vllm_kv_events.py, loaded by path (it holds vLLM 0.32's structs, field for field)."""
    spec = importlib.util.spec_from_file_location("kv_events_vllm_structs", VLLM_TESTS)
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
