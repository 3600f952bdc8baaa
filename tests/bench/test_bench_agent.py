"""`bench agent` counts records, not ring slots: the records one poll reports are the records the
test's own calls wrote, counted by the test; the slots are the ring's own count, fewer (batching).

The test's count is the per-record layout's (the layout before ring layout 3, one record a slot):
each callback writes the records listed in CountingProbe. That list is checked on its own against a
producer forced onto the per-record path, whose ring then counts one slot per record.
"""
from __future__ import annotations

import math

import torch

from infersight.bench.agent import ingest_poll, synthetic_workload
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import MOE_EXPERTS_PER_RECORD
from infersight.runtime.observer import KVBlockEvent
from infersight.runtime.stats import StepStats
from testkit import unique_ring

REQUESTS, TOKENS = 70, 5  # three waves of up to 32 requests, the last one short


class CountingProbe:
    """Every callback synthetic_workload makes, passed on to `probe` and counted in records of the
    per-record layout: a request event is one REQUEST record (SCHEDULED adds its PREFIX, the first
    request of a task its TASK_LABEL), a KV transition or a verification one record, a step's end
    STEP + STEP_TIMING + one BATCH_MEMBER per batch entry, a step's expert counts one MOE record per
    layer and run of MOE_EXPERTS_PER_RECORD experts."""

    def __init__(self, probe: ProbeObserver) -> None:
        self.probe, self.records, self.tasks = probe, 0, set()

    def on_request_arrived(self, rid: int, t: int, prompt: int, task: str, trace: int) -> None:
        self.records += 1 + (task not in self.tasks)
        self.tasks.add(task)
        self.probe.on_request_arrived(rid, t, prompt, task, trace)

    def on_request_scheduled(self, rid: int, t: int, prompt: int, cached: int, group: int) -> None:
        self.records += 2
        self.probe.on_request_scheduled(rid, t, prompt, cached, group)

    def on_kv_block(self, event: KVBlockEvent, block: int, rid: int, block_hash: int) -> None:
        self.records += 1
        self.probe.on_kv_block(event, block, rid, block_hash)

    def on_prefill_chunk(self, rid: int, start: int, end: int, pos: int, n: int) -> None:
        self.records += 1
        self.probe.on_prefill_chunk(rid, start, end, pos, n)

    def on_first_token(self, rid: int, t: int) -> None:
        self.records += 1
        self.probe.on_first_token(rid, t)

    def on_tokens_emitted(self, rid: int, t: int, n: int) -> None:
        self.records += 1
        self.probe.on_tokens_emitted(rid, t, n)

    def on_spec_verified(self, rid: int, proposed: int, accepted: int, mask: list[bool], draft: int,
                         verify: int) -> None:
        self.records += 1
        self.probe.on_spec_verified(rid, proposed, accepted, mask, draft, verify)

    def on_expert_counts(self, step: int, counts: torch.Tensor) -> None:
        layers, experts = counts.shape
        self.records += layers * math.ceil(experts / MOE_EXPERTS_PER_RECORD)
        self.probe.on_expert_counts(step, counts)

    def on_step_end(self, stats: StepStats) -> None:
        self.records += 2 + len(stats.batch)
        self.probe.on_step_end(stats)

    def on_request_finished(self, rid: int, t: int, reason: str, n: int) -> None:
        self.records += 1
        self.probe.on_request_finished(rid, t, reason, n)


def test_the_per_record_count_is_what_a_per_record_producer_writes() -> None:
    """CountingProbe's rule, checked against the layout it describes: forced onto the per-record
    path (as tests/agent/test_batched_layout_equivalence.py forces it), a producer writes one slot a record."""
    # Pauses not timed: a collection of this process would write a record the rule does not count.
    probe = ProbeObserver(ProbeConfig(ring_name=unique_ring("bench-agent-per-record"), ring_capacity=1 << 16,
                                      nvtx=False, host_pause_min_s=None))
    probe._write_step = lambda stats: False  # type: ignore[method-assign]
    probe._block.write_tokens = lambda: False  # type: ignore[method-assign]
    try:
        counting = CountingProbe(probe)
        synthetic_workload(counting, REQUESTS, TOKENS)  # type: ignore[arg-type]
        assert probe.ring.stats()["produced"] == counting.records
    finally:
        probe.close()


def test_ingest_poll_reports_the_records_written_and_the_slots_apart() -> None:
    seen: dict[str, int] = {}

    def write(probe: ProbeObserver) -> None:
        counting = CountingProbe(probe)
        synthetic_workload(counting, REQUESTS, TOKENS)  # type: ignore[arg-type]
        seen["records"], seen["slots"] = counting.records, probe.ring.stats()["produced"]

    poll = ingest_poll(REQUESTS, TOKENS, write)
    assert poll.records == seen["records"]
    assert poll.slots == seen["slots"]
    # A step's batch members go many to a MEMBERS_BATCH slot (probes.record_batches): fewer slots than records.
    assert poll.slots < poll.records
    assert poll.seconds > 0 and poll.cpu_seconds > 0
