"""Fuzzing the agent's probe-record decode path with mutations of real record bytes.

Seeds are the slot bytes (slot header + record) of rings written by the real engine's observer
(a tiny MoE engine with speculation, prefix sharing and preemptions) and by the vLLM writer's
encoding (infersight.vllm.writer: task label, request/step records, text chunks, network timing).
Each case puts mutated slot bytes into a ring and runs what the agent runs on every poll: the ring
read, the RecordScreen (agent.rings.record_limits), EventFrames.from_records and AgentState.ingest; every
RENDER_EVERY cases /metrics renders the state those cases built and a fresh state starts (a render
of a fresh state costs ~0.7 s, which would make 10,000 cases take hours; a render failure is then
reported at the case that closed the batch). Nothing may raise, hang or allocate beyond the fuzz
harness's ceiling; and the screen's accounting must add up exactly: records read = records kept +
records refused.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import pytest
from prometheus_client.exposition import generate_latest
from testkit import one_torch_thread, unique_ring

from fuzzkit import case_count, check, mutations, run_fuzz
from probe_slot_mutations import MAX_TOKENS_PER_EVENT, field_mutations, rebased
from infersight.agent.config import AgentConfig
from infersight.agent.rings.record_limits import RecordLimits, RecordScreen
from infersight.agent.rings.ingest import RingSet
from infersight.agent.state import AgentState
from infersight.exporters.prometheus import build_registry
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, RequestEvent, record_dtype, record_registry
from infersight.probes.ring import RingProducer
from infersight.probes.schema import PRODUCED, PRODUCER_COUNTERS_OFFSET, WRITE_POS
from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams

SEED = 17
SLOTS_PER_SEED = 48
#: The fuzzed ring: a case's bytes fill (at most) this many slots; the rest stay zero (kind 0: corrupt).
FUZZ_CAPACITY = 256
#: Cases folded into one AgentState before /metrics renders it and a fresh state starts.
RENDER_EVERY = 50
TINY = ModelConfig("t", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                   max_seq_len=128)
DRAFT = ModelConfig("d", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=128)


def _slots(ring: RingProducer) -> bytes:
    """The written slots of a ring (written < capacity: no wrap), in order."""
    n = ring.stats()["written"]
    start = ring.header.header_size
    return bytes(ring._buf[start:start + n * ring.header.slot_size])


def _engine_slots() -> bytes:
    probe = ProbeObserver(ProbeConfig(ring_name=unique_ring("fuzz-engine"), ring_capacity=1 << 14, nvtx=False))
    try:
        engine = Engine(EngineConfig(model=TINY, speculative_model=DRAFT, num_kv_blocks=16, block_size=8,
                                     cpu_offload_blocks=8, num_speculative_tokens=3), probe)
        with one_torch_thread():
            for i, (prompt, task) in enumerate([("def f(x):\n    return x", "code"), ("{\"a\": 1", "json"),
                                                ("def f(x):\n    return y", "code"), ("hello", None)]):
                engine.add_request(prompt, SamplingParams(temperature=1.0 if i % 2 else 0.0, max_tokens=12,
                                                          ignore_eos=True, task=task, seed=i))
            while engine.has_unfinished():
                engine.step()
        probe.flush()
        return _slots(probe.ring)
    finally:
        probe.close()


def _vllm_writer_slots() -> bytes:
    from infersight.vllm.writer import VllmProbeSettings, VllmRingWriter

    name = unique_ring("fuzz-vllm")
    writer = VllmRingWriter(VllmProbeSettings.from_env({"INFERSIGHT_RING": name, "INFERSIGHT_EXPORT_CONTENT": "1"},
                                                       os.getpid()))
    try:
        assert writer.open()
        ctx = writer.bind([1, 2], trace_id=(5 << 64) | 9, task="chat")
        step = writer.next_step_id()
        written = writer.write_records([
            (RecordKind.REQUEST, (100, 0, 1, ctx.trace_hi, ctx.trace_lo, 7, 0, ctx.task_id, 1, 0)),
            (RecordKind.REQUEST, (200, 0, 1, ctx.trace_hi, ctx.trace_lo, 7, 2, ctx.task_id, 2, 0)),
            (RecordKind.REQUEST, (300, 0, 1, ctx.trace_hi, ctx.trace_lo, 0, 0, ctx.task_id, 4, 0)),
            (RecordKind.STEP, (step, 150, 300, 7, 1, 0, 0, 3, 1, 64, 16, 0, 1, 0, 0, 1, 0)),
            (RecordKind.BATCH_MEMBER, (step, 1, 7)),
            (RecordKind.REQUEST, (400, 0, 1, ctx.trace_hi, ctx.trace_lo, 5, 0, ctx.task_id, 8, 1)),
        ])
        assert written == 6
        writer.texts.text(1, 4, "a prompt that spans two chunks " * 12)
        writer.on_network(1, 50, 310, 420)
        return _slots(writer._producer)  # type: ignore[arg-type]
    finally:
        writer.close()


@pytest.fixture(scope="module")
def seeds() -> list[bytes]:
    size = _slot_size()
    out = []
    for raw in (_engine_slots(), _vllm_writer_slots()):
        n = len(raw) // size
        assert n > 0
        out += [rebased(raw[i * size:(i + SLOTS_PER_SEED) * size], size) for i in range(0, n, SLOTS_PER_SEED // 2)]
    kinds = {int.from_bytes(s[i * size + 8:i * size + 10], "little") for s in out for i in range(len(s) // size)}
    assert {int(k) for k in (RecordKind.REQUEST, RecordKind.STEP, RecordKind.MOE, RecordKind.SPEC,
                             RecordKind.TASK_LABEL, RecordKind.REQUEST_TEXT, RecordKind.NETWORK)} <= kinds
    return out


def _slot_size() -> int:
    ring = RingProducer.create(unique_ring("fuzz-size"), 2, None, record_registry())
    try:
        return ring.header.slot_size
    finally:
        ring.close()
        ring.unlink()


class FuzzRing:
    """Each case becomes a new ring of FUZZ_CAPACITY slots: the case's bytes are its slots (cut or
    zero-padded to whole slots), its producer counters say they were all written (the layout's
    documented offsets, through the segment itself), and an agent RingSet attaches and reads it as
    it would a live engine's ring."""

    def __init__(self) -> None:
        self.registry = record_registry()
        self.rejected: Counter[str] = Counter()
        self.batched = [0, 0]  # this case's batched slots expanded, and the rows they became
        self.state: AgentState | None = None
        self.folded = 0  # cases folded into self.state

    def _expand(self, records: dict, positions: dict) -> tuple[dict, int]:
        """The reader's expand (probes.record_batches), counting: a batched slot is many rows."""
        plain = (int(RecordKind.REQUEST), int(RecordKind.BATCH_MEMBER))
        before = sum(len(records.get(k, ())) for k in plain)
        slots = sum(len(records.get(int(k), ())) for k in (RecordKind.TOKENS_BATCH, RecordKind.MEMBERS_BATCH))
        out, refused = self._plain_expand(records, positions)
        self.batched[0] += slots - refused
        self.batched[1] += sum(len(out.get(k, ())) for k in plain) - before
        return out, refused

    def decode(self, case: bytes) -> Counter[str]:
        """One case through the agent's poll; what the ring and the screen counted (slots, refusals)."""
        producer = RingProducer.create(unique_ring("fuzz"), FUZZ_CAPACITY, None, self.registry)
        rings = None
        try:
            hdr = producer.header
            region = FUZZ_CAPACITY * hdr.slot_size
            data = case[:region]
            n = -(-len(data) // hdr.slot_size)
            shm = SharedMemory(name=producer.name, **({"track": False} if sys.version_info >= (3, 13) else {}))
            try:
                shm.buf[hdr.header_size:hdr.header_size + region] = data + bytes(region - len(data))
                counters = shm.buf[PRODUCER_COUNTERS_OFFSET:PRODUCER_COUNTERS_OFFSET + 24].cast("Q")
                counters[WRITE_POS] = counters[PRODUCED] = n
                counters.release()
            finally:
                shm.close()
            self.batched = [0, 0]
            rings = RingSet([producer.name], discover=False)
            rings.refresh()
            (ring,) = rings.attached.values()
            self._plain_expand, ring.consumer._expand = ring.consumer._expand, self._expand  # counted
            return self.read(rings, n)
        finally:
            if rings is not None:
                rings.close()
            producer.close()
            producer.unlink()

    def read(self, rings: RingSet, n: int) -> Counter[str]:
        """One agent poll over the ring: read, screen, decode, fold into the state (rendered every
        RENDER_EVERY cases); then the accounting: every slot is consumed or corrupt, every record kept
        or refused."""
        (ring,) = rings.attached.values()
        if self.state is None:
            self.state, self.folded = AgentState(AgentConfig(rings=[ring.name], port=0)), 0
        got = rings.read()
        for _, frames in got:
            self.state.ingest(frames)
        refused = rings.screen.take_rejected()
        self.state.count_rejected(refused)
        self.folded += 1
        if self.folded == RENDER_EVERY:
            self.render()
        for (_, reason), k in refused.items():
            self.rejected[reason] += k
        stats = ring.consumer.stats()
        one_row_each = sum(len(getattr(f, name)) for _, f in got for name in ONE_ROW_PER_RECORD)
        one_row_each += self.batched[0] - self.batched[1]  # as slots: a batched slot's rows count once
        moe_rows = sum(len(f.moe) for _, f in got)
        # What is left are MoE records (1..64 rows each) and admitted task labels (no row).
        rest = stats["consumed"] - one_row_each - sum(refused.values())
        if stats["consumed"] + stats["corrupt"] != n or rest < 0 or moe_rows > 64 * rest:
            raise AssertionError(f"accounting: {n} slots, {stats}, {one_row_each} rows, {moe_rows} MoE rows, "
                                 f"refused {refused}")
        tally = Counter({"slots": n, "slots consumed": stats["consumed"], "slots corrupt": stats["corrupt"]})
        tally.update({f"records refused: {reason}": k for (_, reason), k in refused.items()})
        tally["cases with a counted drop"] = int(stats["corrupt"] > 0 or bool(refused))
        return tally


    def render(self) -> None:
        """/metrics of the state the cases since the last render built; the next case starts a new one."""
        if self.state is not None:
            generate_latest(build_registry(self.state))
        self.state = None


ONE_ROW_PER_RECORD = ("request_events", "steps", "batch", "kv_events", "spec", "prefix", "network", "served",
                      "texts", "ep", "step_timing")


def fuzzed(name: str, cases: list[bytes]) -> None:
    """Run the cases through a FuzzRing."""
    check(name, run_fuzz(FuzzRing().decode, cases, allowed=(), per_case_s=5.0, mem_mb=768))


def test_mutated_probe_records_never_crash_the_agent(seeds: list[bytes]) -> None:
    fuzzed("probe records", mutations(seeds, case_count(), SEED))


def test_probe_record_fields_at_their_limits_never_crash_the_agent(seeds: list[bytes]) -> None:
    """Structure-aware: record fields at their type's limits, slot kinds, lengths and seqs changed,
    the rest of each slot intact, so the screen and the decoders meet them (a byte mutation mostly
    lands in a seq or a length, and the ring counts the slot corrupt before decoding it)."""
    fuzzed("probe record fields", field_mutations(seeds, _slot_size(), case_count(), SEED + 1))


def test_the_unmutated_seeds_decode_with_nothing_refused(seeds: list[bytes]) -> None:
    """The harness itself: real records go through whole (a screen that refused them, or a ring
    that found them corrupt, would let the fuzz pass vacuously)."""
    ring = FuzzRing()
    for seed in seeds:
        tally = ring.decode(seed)
        assert tally["slots corrupt"] == 0 and tally["slots consumed"] == tally["slots"] > 0, tally
    ring.render()
    assert not ring.rejected


def test_the_issues_moe_record_is_refused_in_the_fuzz_ring(seeds: list[bytes]) -> None:
    """A seed's MoE slot with layer=65535 written over it: refused and counted, never a 32 GiB matrix."""
    size = _slot_size()
    kind_at = [(s, i) for s in seeds for i in range(len(s) // size)
               if int.from_bytes(s[i * size + 8:i * size + 10], "little") == RecordKind.MOE]
    seed, i = kind_at[0]
    case = bytearray(seed)
    case[i * size + 16 + 8:i * size + 16 + 10] = (65535).to_bytes(2, "little")  # MOE.layer, after step_id
    ring = FuzzRing()
    ring.decode(bytes(case))
    assert ring.rejected == {"moe_layer_over_limit": 1}


@pytest.mark.parametrize("tokens", [2**63 - 1, 4_000_000_000, MAX_TOKENS_PER_EVENT + 1])
def test_regression_a_tokens_count_past_any_step_is_refused(tokens: int) -> None:
    # found by the structure-aware run (case 176 of 200): a REQUEST TOKENS event with value0 = 2^63 - 1
    # passed the screen and reached the ITL fold, whose np.repeat (one row per claimed token) raised
    # "negative dimensions are not allowed" in the poll; 4e9 tokens would ask numpy for ~96 GB
    screen = RecordScreen(RecordLimits())
    rec = np.zeros(2, record_dtype(RecordKind.REQUEST))
    rec["event"], rec["value0"] = int(RequestEvent.TOKENS), [tokens, 1]
    kept, _ = screen.screen("r", {int(RecordKind.REQUEST): rec}, {})
    assert kept[int(RecordKind.REQUEST)]["value0"].tolist() == [1]
    assert sum(screen.take_rejected().values()) == 1
