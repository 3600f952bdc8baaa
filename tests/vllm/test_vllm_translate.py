"""infersight.vllm.translate on hand-built stand-ins of vLLM's stats objects (same attribute names
as vllm/v1/metrics/stats.py), with exact expected records; then the records through a real ring
and the agent's own request table, as the agent reads them. No vLLM needed."""
from __future__ import annotations

import enum
from types import SimpleNamespace as NS

import pandas as pd
import pytest
from testkit import unique_ring

from infersight.correlate.frames import EventFrames, update_labels
from infersight.correlate.requests import request_table
from infersight.probes.records import RecordKind, record_registry
from infersight.probes.ring import RingConsumer
from infersight.probes.config import ProbeConfig
from infersight.vllm.translate import (
    Clock, KvGeometry, RequestContext, draft_outcomes, finish_reason_code, request_records, spec_records,
    step_record, step_window,
)
from infersight.vllm.writer import VllmProbeSettings, VllmRingWriter

R, STEP, SPEC, PREFIX = RecordKind.REQUEST, RecordKind.STEP, RecordKind.SPEC, RecordKind.PREFIX
ARRIVED, SCHEDULED, CHUNK, FIRST, TOKENS, PREEMPTED, RESUMED, FINISHED = range(1, 9)
S = 1_000_000_000  # ns per second


class VllmFinishReason(enum.IntEnum):
    """Like vllm.v1.engine.FinishReason: an IntEnum whose str() is the lower-case name."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


def spec_stats(drafts: list[tuple[int, int]], k: int = 3) -> NS:
    """SpecDecodingStats as vLLM's observe_draft builds it, from (proposed, accepted) per draft."""
    st = NS(num_spec_tokens=k, num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0,
            num_draft_tokens_per_pos=[0] * k, num_accepted_tokens_per_pos=[0] * k)
    for proposed, accepted in drafts:
        st.num_drafts += 1
        st.num_draft_tokens += proposed
        st.num_accepted_tokens += accepted
        for i in range(accepted):
            st.num_accepted_tokens_per_pos[i] += 1
        for i in range(proposed):
            st.num_draft_tokens_per_pos[i] += 1
    return st


def sched_stats(spec: NS | None = None, details: NS | None = None) -> NS:
    return NS(num_running_reqs=3, num_waiting_reqs=2, num_skipped_waiting_reqs=1, kv_cache_usage=0.25,
              spec_decoding_stats=spec, iteration_details=details)


def iter_stats(finished: list[NS] = ()) -> NS:
    return NS(iteration_timestamp=1000.0, num_preempted_reqs=1, prompt_token_stats=NS(computed=40),
              inter_token_latencies_iter=[0.01, 0.02], finished_requests=list(finished))


def finished(out: int = 10, prefill: float = 0.2, decode: float = 0.5, preemptions: int = 1,
             reason: object = VllmFinishReason.LENGTH) -> NS:
    return NS(finish_reason=reason, request_id="cmpl-abc-0", e2e_latency=1.0, num_prompt_tokens=100,
              num_preemptions=preemptions, num_generation_tokens=out, queued_time=0.1, prefill_time=prefill,
              decode_time=decode, num_cached_tokens=64)


def test_clock_maps_wall_seconds_to_monotonic_ns() -> None:
    clock = Clock(wall_ns=1_000 * S, mono_ns=5_000)
    assert clock.mono(999.5) == 5_000 - S // 2
    assert clock.mono(1_000.0) == 5_000


def test_clock_pair_keeps_the_tightest_bracket() -> None:
    """A thread switch of 3 ms between the first monotonic read and the wall read: that bracket is dropped,
    the second (1 us wide) kept, its wall read paired with the bracket's midpoint."""
    monos = iter([0, 3_000_000, 3_010_000, 3_011_000])
    walls = iter([1_000 * S + 3_000_000, 1_000 * S + 3_010_500])
    clock = Clock.now(wall=lambda: next(walls), mono=lambda: next(monos))
    assert (clock.wall_ns, clock.mono_ns) == (1_000 * S + 3_010_500, 3_010_500)
    # Every try wide: the narrowest of the three.
    monos = iter([0, 900_000, 1_000_000, 1_400_000, 2_000_000, 2_700_000])
    walls = iter([10, 20, 30])
    clock = Clock.now(wall=lambda: next(walls), mono=lambda: next(monos))
    assert (clock.wall_ns, clock.mono_ns) == (20, 1_200_000)


def test_drafts_rebuilt_from_per_position_counters() -> None:
    # Lengths 3, 3, 2, 1 with accepts 3, 1, 0, 1: the multisets are exact; the pairing of the
    # length-2 and length-1 drafts with their accept counts is not in the stats, so the most
    # accepted go with the longest drafts.
    st = spec_stats([(3, 3), (3, 1), (2, 0), (1, 1)])
    assert st.num_draft_tokens_per_pos == [4, 3, 2] and st.num_accepted_tokens_per_pos == [3, 1, 1]
    assert draft_outcomes(st) == [(3, 3), (3, 1), (2, 1), (1, 0)]
    assert spec_records(77, st) == [(SPEC, (77, 0, 0, 0, 0b111, 0, 3, 3)), (SPEC, (77, 0, 0, 0, 0b1, 0, 3, 1)),
                                    (SPEC, (77, 0, 0, 0, 0b1, 0, 2, 1)), (SPEC, (77, 0, 0, 0, 0, 0, 1, 0))]
    # Round trip: the rebuilt drafts give back every counter vLLM reported.
    again = spec_stats(draft_outcomes(st))
    assert vars(again) == vars(st)


def test_drafts_of_equal_length_are_exact() -> None:
    drafts = [(3, 0), (3, 2), (3, 3), (3, 0)]
    assert sorted(draft_outcomes(spec_stats(drafts))) == sorted(drafts)
    assert draft_outcomes(spec_stats([])) == []


def test_step_record_without_iteration_details() -> None:
    spec = spec_stats([(3, 3), (3, 1), (2, 0), (1, 1)])
    rec = step_record(7, 100, 200, sched_stats(spec), iter_stats([finished()]), KvGeometry(63, 32))
    # prefill: prompt tokens computed by requests that finished prefill; decode: one per decoding
    # request (two inter-token latencies); kv in use: round(0.25 * 63) = 16; waiting 2 + 1 deferred.
    assert rec == (STEP, (7, 100, 200, 40, 2, 9, 5, 16, 0, 63, 32, 3, 3, 0, 1, 0, 1))


def test_step_record_with_iteration_details() -> None:
    spec = spec_stats([(3, 3), (3, 1), (2, 0), (1, 1)])
    sched = sched_stats(spec, NS(num_ctx_tokens=48, num_generation_tokens=14, elapsed_ms=2.5))
    assert step_window(10_000_000, 9_000_000, sched) == (7_500_000, 10_000_000)
    rec = step_record(8, 7_500_000, 10_000_000, sched, None, KvGeometry(63, 32))
    # decode = generation-phase tokens less the 9 drafts; no iteration stats: nothing preempted or finished.
    assert rec == (STEP, (8, 7_500_000, 10_000_000, 48, 5, 9, 5, 16, 0, 63, 32, 3, 3, 0, 0, 0, 0))
    assert step_record(9, 5, 5, None, None, KvGeometry(0, 16)) == (
        STEP, (9, 5, 5, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0))


def test_step_window_follows_the_previous_step_unless_idle() -> None:
    assert step_window(500, 300, sched_stats()) == (300, 500)
    assert step_window(500, None, sched_stats()) == (500, 500)   # idle before: no invented duration
    assert step_window(500, 900, None) == (500, 500)             # clocks out of order: zero length


def test_finished_request_lifecycle_is_rebuilt_from_its_intervals() -> None:
    ctx = RequestContext(1, 2, 3)
    f = 10 * S
    # A = F - e2e = 9 s; T = F - decode = 9.5 s; S = T - prefill = 9.3 s.
    a, t, s = 9 * S, 9_500_000_000, 9_300_000_000

    def req(ts: int, event: int, v0: int = 0, v1: int = 0, reason: int = 0, end: int = 0) -> tuple:
        return R, (ts, end, 42, 1, 2, v0, v1, 3, event, reason)

    assert request_records(finished(), 42, f, ctx) == [
        req(a, ARRIVED, 100), req(s, SCHEDULED, 100, 64), (PREFIX, (s, 42, 0, 100, 64, 3)),
        req(s, CHUNK, 36, 64, end=t), req(s, PREEMPTED, reason=1), req(s, RESUMED), req(t, FIRST),
        req(t, TOKENS, 1), req(f, TOKENS, 9), req(f, FINISHED, 10, reason=2)]
    no_prefix = request_records(finished(preemptions=0), 42, f, ctx, prefix_caching=False)
    assert [r[0] for r in no_prefix] == [R] * 7 and PREFIX not in [r[0] for r in no_prefix]


def test_request_without_output_has_no_invented_schedule() -> None:
    # vLLM's first_token_ts stays 0 for such a request, so its prefill interval is negative.
    fin = finished(out=0, prefill=-123.0, decode=0.0, preemptions=0, reason=VllmFinishReason.ABORT)
    assert request_records(fin, 5, 10 * S, RequestContext()) == [
        (R, (9 * S, 0, 5, 0, 0, 100, 0, 0, ARRIVED, 0)), (R, (10 * S, 0, 5, 0, 0, 0, 0, 0, FINISHED, 3))]


def test_finish_reasons() -> None:
    assert [finish_reason_code(r) for r in VllmFinishReason] == [1, 2, 3, 4]
    assert finish_reason_code("stop") == 1 and finish_reason_code("repetition") == 4


@pytest.fixture
def writer() -> VllmRingWriter:
    w = VllmRingWriter(VllmProbeSettings(ProbeConfig(ring_name=unique_ring("vllm-translate"), ring_capacity=256)))
    yield w
    w.close()


def test_records_read_back_as_the_agent_reads_them(writer: VllmRingWriter) -> None:
    writer.open()
    consumer = RingConsumer.attach(writer.ring_name, record_registry())
    try:
        ctx = writer.bind([42], (0xAB << 64) | 0xCD, "code")
        assert writer.take_context(42) == ctx == RequestContext(0xAB, 0xCD, 1)
        assert writer.take_context(42) == RequestContext()  # taken once
        fin = finished()
        writer.write_records(request_records(fin, 42, 10 * S, ctx))
        records = consumer.read()
        frames = EventFrames.from_records(records, update_labels({}, records))
        row = request_table(frames.request_events).iloc[0]
    finally:
        consumer.close()
    assert (row["task"], row["trace_id"]) == ("code", f"{0xAB:016x}{0xCD:016x}")
    counts = (row["prompt_tokens"], row["cached_tokens"], row["output_tokens"], row["num_preemptions"])
    assert counts == (100, 64, 10, 1)
    # vLLM's own intervals come back: e2e exact; TTFT = e2e - decode; prefill and decode exact; the
    # queue is what is left (it holds vLLM's queued time plus the frontend -> engine hand-off).
    assert row["e2e_s"] == pytest.approx(fin.e2e_latency, abs=1e-9)
    assert row["ttft_s"] == pytest.approx(fin.e2e_latency - fin.decode_time, abs=1e-9)
    assert (row["prefill_s"], row["decode_s"], row["preemption_stall_s"]) == pytest.approx((0.2, 0.5, 0.0), abs=1e-9)
    assert row["queue_s"] == pytest.approx(0.3, abs=1e-9)
    assert isinstance(frames.prefix, pd.DataFrame) and frames.prefix["cached_tokens"].tolist() == [64]


def test_writer_never_raises_and_counts_failures(writer: VllmRingWriter) -> None:
    writer.open()
    clash = VllmRingWriter(VllmProbeSettings(ProbeConfig(ring_name=writer.ring_name)))  # the name is taken
    assert clash.open() is False and clash.write_records(request_records(finished(), 1, S, RequestContext())) == 0
    assert clash.failures == {"creating the probe ring": 1}
    assert writer.write_records([(STEP, (1, 2))]) == 0  # a record that does not pack: counted, skipped
    assert writer.failures == {"writing a STEP record": 1}


def test_settings_from_the_environment() -> None:
    st = VllmProbeSettings.from_env({"INFERSIGHT_TASK_LABELS": "code, chat", "INFERSIGHT_MAX_TASK_LABELS": "x",
                                     "INFERSIGHT_EXPORT_CONTENT": "1"}, pid=99)
    assert st.probe.ring_name == "infersight-vllm-99" and st.probe.task_labels == ("code", "chat")
    assert st.probe.max_task_labels == 32 and st.export_content and st.enabled
    assert st.problems == ("INFERSIGHT_MAX_TASK_LABELS='x' is not a positive integer; using 32",)
    off = VllmProbeSettings.from_env({"INFERSIGHT_VLLM_PROBES": "0", "INFERSIGHT_RING": "infersight-x"}, pid=1)
    assert off.probe.ring_name == "infersight-x" and not off.enabled and not off.export_content
    w = VllmRingWriter(off)
    assert w.open() is False and w.failures == {}
