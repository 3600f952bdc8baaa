"""Writing a probe record never raises into the engine: values out of a field's range are coerced
(saturated, replaced) and counted. The issue's values (max_tokens >= 2**32, top_k +-1e30, a lone
surrogate in a string) go through the observer and the server's record writer, and are read back
from the ring by the agent's decode path."""
from __future__ import annotations

import math
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from testkit import unique_ring

from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, record_dtype, record_registry, record_struct
from infersight.probes.ring import RingConsumer
from infersight.runtime.observer import KVBlockEvent
from infersight.runtime.stats import StepStats
from infersight.serve.probe_records import ProbeWriter, ServedRecord
from infersight.serve.tracecontext import IncomingTrace

I64_MAX, I64_MIN, U32_MAX = 2**63 - 1, -(2**63), 2**32 - 1


def _served(max_tokens: object, top_k: object, temperature: object = 1.0, seed: object = -1) -> tuple:
    return (7, 100, 0, temperature, 1.0, top_k, seed, max_tokens, 1, 0)


def _unpack(kind: RecordKind, data: bytes) -> np.void:
    return np.frombuffer(data, record_dtype(kind))[0]


@pytest.mark.parametrize("max_tokens, top_k, want_max, want_k", [
    (2**32, 5, U32_MAX, 5), (2**64 + 3, 5, U32_MAX, 5), (-1, 5, 0, 5),
    (16, 1e30, 16, I64_MAX), (16, -1e30, 16, I64_MIN), (16, float("nan"), 16, 0), (16, 3.7, 16, 3),
    (16, float("inf"), 16, I64_MAX), (16, None, 16, 0), (16, "x", 16, 0), (np.uint64(2**63), 2, 2**32 - 1, 2),
])
def test_int_fields_saturate_and_count(max_tokens, top_k, want_max, want_k) -> None:
    s = record_struct(RecordKind.SERVED)
    with pytest.raises(struct.error):
        s.fast_pack(*_served(max_tokens, top_k))  # the plain pack the engine used to call
    rec = _unpack(RecordKind.SERVED, s.pack(*_served(max_tokens, top_k)))
    assert (int(rec["max_tokens"]), int(rec["top_k"])) == (want_max, want_k)
    assert int(rec["request_id"]) == 7 and int(rec["receive_ns"]) == 100  # the other fields are untouched
    assert sum(s.fixes.values()) == 1


def test_float_fields_take_anything_and_bytes_fields_replace() -> None:
    s = record_struct(RecordKind.SERVED)
    rec = _unpack(RecordKind.SERVED, s.pack(*_served(16, 1, temperature=10**400)))
    assert math.isinf(rec["temperature"]) and rec["temperature"] > 0
    rec = _unpack(RecordKind.SERVED, s.pack(*_served(16, 1, temperature=object())))
    assert math.isnan(rec["temperature"])
    assert dict(s.fixes) == {"temperature: clamped": 1, "temperature: not a number": 1}
    t = record_struct(RecordKind.TASK_LABEL)
    rec = _unpack(RecordKind.TASK_LABEL, t.pack(3, "a\ud800b"))
    assert bytes(rec["label"]) == b"a?b" and dict(t.fixes) == {"label: unencodable": 1}
    assert t.pack(3, "plain") == t.fast_pack(3, b"plain") and dict(t.fixes) == {"label: unencodable": 1}


def test_a_wrong_number_of_values_is_still_a_caller_bug() -> None:
    with pytest.raises(struct.error, match="takes 10 values"):
        record_struct(RecordKind.SERVED).pack(1, 2)


@pytest.fixture
def probe():
    obs = ProbeObserver(ProbeConfig(ring_name=unique_ring("encode"), ring_capacity=1024, nvtx=False))
    consumer = RingConsumer.attach(obs.ring_name, record_registry())
    yield obs, consumer
    consumer.close()
    obs.close()


def _frames(consumer: RingConsumer) -> EventFrames:
    records = consumer.read()
    return EventFrames.from_records(records, update_labels({}, records))


def test_observer_callbacks_with_out_of_range_values_write_and_count(probe) -> None:
    obs, consumer = probe
    obs.on_request_arrived(1, 10, 2**70, "\ud800task", 0)      # prompt tokens beyond i64, a lone surrogate
    obs.on_tokens_emitted(1, 20, -5)                           # fits value0 (signed): written as is
    obs.on_kv_block(KVBlockEvent.ALLOCATED, 2**40, 1, -1)      # block id beyond u32, a negative hash
    obs.on_spec_verified(1, 70_000, 3, [True] * 3, 1, 2)        # proposed beyond u16
    obs.on_step_end(StepStats(5, 0, 100, num_decode_tokens=2**33, batch=[(1, 2**33), (2, 1)]))
    obs.on_request_finished(1, 30, "stop", 1)
    frames = _frames(consumer)
    ev = frames.request_events
    assert ev["event"].tolist() == ["ARRIVED", "TOKENS", "FINISHED"]
    assert ev["value0"].tolist() == [I64_MAX, -5, 1]
    assert ev["task"].tolist() == ["?task"] * 3
    assert frames.kv_events["block_id"].tolist() == [U32_MAX]
    assert frames.spec["proposed"].tolist() == [65535]
    assert frames.steps["decode_tokens"].tolist() == [U32_MAX]
    assert frames.batch[["request_id", "num_tokens"]].values.tolist() == [[1, U32_MAX], [2, 1]]
    assert obs.encode_fixes == {
        "REQUEST value0: clamped": 1, "TASK_LABEL label: unencodable": 1, "KV_BLOCK block_id: clamped": 1,
        "KV_BLOCK block_hash: clamped": 1, "SPEC proposed: clamped": 1, "STEP decode_tokens: clamped": 1,
        "STEP_TIMING decode_requests: clamped": 1, "BATCH_MEMBER num_tokens: clamped": 1}
    assert consumer.stats()["corrupt"] == 0


def test_served_record_with_the_issues_values_reaches_the_agent(probe) -> None:
    """`infersight serve`'s SERVED writer with max_tokens 2**32 and top_k +-1e30 (what the door let
    through before validation): the record lands, saturated, instead of struct.error in the log."""
    obs, consumer = probe
    writer = ProbeWriter(obs, max_text_bytes=1024)
    trace = IncomingTrace(trace_id=1)
    for rid, (max_tokens, top_k) in enumerate([(2**32, 1e30), (5, -1e30), (2**40, 10)]):
        params = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=top_k, seed=None, max_tokens=max_tokens)
        writer.served(rid, ServedRecord("chat", 100 + rid, trace, params, False))  # type: ignore[arg-type]
    served = _frames(consumer).served
    assert served["max_tokens"].tolist() == [U32_MAX, 5, U32_MAX]
    assert served["top_k"].tolist() == [I64_MAX, I64_MIN, 10]
    assert served["receive_ns"].tolist() == [100, 101, 102]
