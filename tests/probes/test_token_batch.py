"""Batched TOKENS records: the same records, in the same ring order, as one write per event."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, RequestEvent, record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime.stats import StepStats

_names = itertools.count()


@pytest.fixture
def probe():
    obs = ProbeObserver(ProbeConfig(nvtx=False, ring_name=f"infersight-tb-{next(_names)}-{id(object())}"))
    consumer = RingConsumer.attach(obs.ring_name, record_registry())
    yield obs, consumer
    consumer.close()
    obs.close()


def _requests(consumer: RingConsumer) -> np.ndarray:
    return consumer.read().get(int(RecordKind.REQUEST), np.empty(0))


def test_a_steps_tokens_are_the_per_event_records(probe) -> None:
    obs, consumer = probe
    traces = {rid: (rid * 0x1_0000_0001 << 64) | (0xFFFF_FFFF_FFFF_FFF0 + rid) for rid in range(3)}
    for rid, trace in traces.items():
        obs.on_request_arrived(rid, 10 + rid, 5, "chat" if rid else None, trace)
    _requests(consumer)
    for rid in range(3):
        obs.on_tokens_emitted(rid, 100 + rid, rid + 1)
    obs.on_tokens_emitted(99, 200, 2)  # a request the observer never saw arrive
    obs.on_step_end(StepStats(1, 0, 0, batch=[(0, 1), (1, 1), (2, 1)]))
    req = _requests(consumer)
    # Expected fields straight from the calls above: trace split by hand, task 1 = "chat".
    want = [(100 + r, 0, r, traces[r] >> 64, traces[r] & (2 ** 64 - 1), r + 1, 0, 1 if r else 0) for r in range(3)]
    want.append((200, 0, 99, 0, 0, 2, 0, 0))
    fields = ["ts_ns", "end_ns", "request_id", "trace_hi", "trace_lo", "value0", "value1", "task_id"]
    assert [tuple(int(x) for x in row) for row in req[fields]] == want
    assert req["event"].tolist() == [RequestEvent.TOKENS] * 4 and not req["reason"].any()


def test_tokens_precede_the_records_written_after_them(probe) -> None:
    obs, consumer = probe
    obs.on_request_arrived(1, 1, 5, None, 7)
    obs.on_first_token(1, 2)
    obs.on_tokens_emitted(1, 3, 1)
    obs.on_request_finished(1, 4, "stop", 1)  # FINISHED must never overtake the last TOKENS
    obs.on_request_arrived(2, 5, 5, None, 8)
    obs.on_tokens_emitted(2, 6, 4)
    assert _requests(consumer)["event"].tolist() == [
        RequestEvent.ARRIVED, RequestEvent.FIRST_TOKEN, RequestEvent.TOKENS, RequestEvent.FINISHED,
        RequestEvent.ARRIVED]  # request 2's tokens wait for the step's end
    obs.on_step_end(StepStats(2, 0, 0))  # an idle-looking step still flushes
    req = _requests(consumer)
    assert req["event"].tolist() == [RequestEvent.TOKENS] and req["value0"].tolist() == [4]


def test_a_value_out_of_range_is_coerced_and_counted_not_lost(probe) -> None:
    obs, consumer = probe
    obs.on_tokens_emitted(5, 10, 1)
    obs.on_tokens_emitted(2 ** 64 + 3, 11, 1)  # does not fit request_id: the per-record coercing path
    obs.on_step_end(StepStats(1, 0, 0))
    req = _requests(consumer)
    assert req["ts_ns"].tolist() == [10, 11] and req["request_id"][0] == 5
    assert obs.encode_fixes  # the coerced field is counted


def test_a_held_batch_reads_as_its_per_event_records(probe) -> None:
    obs, consumer = probe
    trace = (5 << 64) | 6
    obs.on_request_arrived(1, 1, 5, "chat", trace)
    _requests(consumer)
    ids, counts = [1, 2, 99], [1, 3, 2]
    obs.on_tokens_emitted_many(ids, 300, counts)
    obs.on_step_end(StepStats(1, 0, 0, batch=[(1, 1), (2, 1), (99, 1)]))
    obs.on_tokens_emitted_many([1, 2], 400, [1, 1])
    obs.on_tokens_emitted(2, 401, 5)  # a single emission after the batch: all three, in order
    obs.on_step_end(StepStats(2, 0, 0))
    obs.on_tokens_emitted_many([1], 500, [4])
    obs.on_request_finished(1, 501, "stop", 9)  # the batch is written before the FINISHED
    req = _requests(consumer)
    fields = ["ts_ns", "request_id", "trace_hi", "trace_lo", "value0", "task_id", "event"]
    tok, fin = int(RequestEvent.TOKENS), int(RequestEvent.FINISHED)
    assert [tuple(int(x) for x in row) for row in req[fields]] == [
        (300, 1, 5, 6, 1, 1, tok), (300, 2, 0, 0, 3, 0, tok), (300, 99, 0, 0, 2, 0, tok),
        (400, 1, 5, 6, 1, 1, tok), (400, 2, 0, 0, 1, 0, tok), (401, 2, 0, 0, 5, 0, tok),
        (500, 1, 5, 6, 4, 1, tok), (501, 1, 5, 6, 9, 1, fin)]
    assert ids == [1, 2, 99] and counts == [1, 3, 2]  # the caller's lists untouched


@pytest.mark.parametrize("t_ns", [2 ** 63, -2 ** 63 - 1, 7.5])
def test_a_batch_timestamp_that_does_not_fit_is_coerced_and_counted(probe, t_ns) -> None:
    obs, consumer = probe
    obs.on_tokens_emitted_many([3, 4], t_ns, [1, 2])
    obs.on_step_end(StepStats(1, 0, 0, batch=[(3, 1), (4, 1)]))
    req = _requests(consumer)
    assert req["request_id"].tolist() == [3, 4] and req["value0"].tolist() == [1, 2]
    assert obs.encode_fixes and all(key.startswith("REQUEST ts_ns") for key in obs.encode_fixes)
