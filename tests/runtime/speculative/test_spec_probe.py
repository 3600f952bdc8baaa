"""The control path that runs a counted share of decode steps without speculation
(EngineConfig.spec_probe_every), and the STEP_TIMING records that carry the step's parts.

The expected probe steps are derived from the STEP_TIMING stream itself by the stated rule (the
1st, (N+1)th ... step with drafts at each batch size, pure-decode and mixed steps counted apart),
and checked against what the other streams say happened in those steps (no verification, one
token per decoding request)."""
from __future__ import annotations

import math
from collections import Counter, defaultdict

import pytest
import torch
from testkit import one_torch_thread, unique_ring

from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams
from infersight.runtime.observer import EngineObserver

EVERY = 3
TARGET = ModelConfig("sp-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                     max_seq_len=96)
DRAFT = ModelConfig("sp-draft", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=96)
PROMPTS = ["hello world, hello world", "abc", "the quick brown fox", "0123456789"]
MAX_TOKENS = [24, 10, 17, 30]  # requests finish at different steps: the batch size changes


LATE = {3: "a later prompt", 6: "another later one", 9: "and a third"}  # step -> prompt: mixed steps


def _run(config: EngineConfig, observer: ProbeObserver | None = None) -> tuple[list[list[int]], list]:
    engine = Engine(config, observer)

    def add(prompt: str, n: int) -> int:
        return engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, task="code"))

    ids = [add(p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    stats = []
    while engine.has_unfinished():
        if len(stats) in LATE:  # arrives while the others decode: its prefill runs beside them
            ids.append(add(LATE[len(stats)], 12))
        stats.append(engine.step())
    return [engine.get_output(i).token_ids for i in ids], stats


@pytest.fixture(scope="module")
def probed() -> tuple[list[list[int]], list, EventFrames]:
    name = unique_ring("spec-probe")
    obs = ProbeObserver(ProbeConfig(ring_name=name, nvtx=False))
    consumer = RingConsumer.attach(name, record_registry())
    try:
        with one_torch_thread():
            config = EngineConfig(TARGET, speculative_model=DRAFT, num_speculative_tokens=3, spec_probe_every=EVERY,
                                  block_size=8, num_kv_blocks=64)
            tokens, stats = _run(config, obs)
        records = consumer.read()
        assert consumer.dropped_seen == 0
        return tokens, stats, EventFrames.from_records(records, update_labels({}, records))
    finally:
        consumer.close()
        obs.close()


def test_the_stated_share_of_decode_steps_runs_plain(probed) -> None:
    _, _, f = probed
    t = f.step_timing.sort_values("step_id")
    eligible = t[(t["decode_requests"] > 0) & (t["spec_probe"] | (t["spec_tokens"] > 0))]
    seen: Counter[tuple[bool, int]] = Counter()
    expected = []
    for mixed, b in zip((eligible["prefill_tokens"] > 0).tolist(), eligible["decode_requests"].tolist()):
        expected.append(seen[mixed, b] % EVERY == 0)
        seen[mixed, b] += 1
    assert eligible["spec_probe"].tolist() == expected
    assert not t.loc[~t.index.isin(eligible.index), "spec_probe"].any()
    pure = [n for (mixed, _), n in seen.items() if not mixed]
    assert len(pure) >= 3 and max(pure) > EVERY  # several batch sizes, some seen more than N times
    assert any(mixed for mixed, _ in seen)  # and mixed steps, counted apart
    per_b = eligible.groupby([eligible["prefill_tokens"] > 0, "decode_requests"])["spec_probe"].agg(["sum", "size"])
    assert (per_b["sum"] == [math.ceil(n / EVERY) for n in per_b["size"]]).all()


def test_probe_steps_are_plain_decode_steps(probed) -> None:
    _, _, f = probed
    probes = f.step_timing[f.step_timing["spec_probe"]]
    assert len(probes) > 0 and (probes["prefill_tokens"] > 0).any() and (probes["prefill_tokens"] == 0).any()
    assert (probes["spec_tokens"] == 0).all() and (probes["draft_ns"] == 0).all()
    assert (probes["draft_forwards"] == 0).all() and (probes["target_ns"] > 0).all()
    ev = f.request_events
    tokens = ev[ev["event"] == "TOKENS"]
    for p in probes.itertuples(index=False):
        assert not f.spec["ts_ns"].between(p.start_ns, p.end_ns).any()  # nothing verified
        chunks = ev[(ev["event"] == "PREFILL_CHUNK") & ev["ts_ns"].between(p.start_ns, p.end_ns)]
        assert chunks["value0"].sum() == p.prefill_tokens
        emitted = tokens[tokens["ts_ns"].between(p.start_ns, p.end_ns) & ~tokens["request_id"].isin(chunks["request_id"])]
        assert len(emitted) == p.decode_requests and (emitted["value0"] == 1).all()  # one token each decoding request


def test_timings_reach_the_records(probed) -> None:
    _, stats, f = probed
    t = f.step_timing.set_index("step_id")
    assert len(t) == len(stats)
    for s in stats:
        r = t.loc[s.step_id]
        assert (r.start_ns, r.end_ns, r.schedule_ns, r.draft_ns, r.target_ns, r.decode_requests, r.prefill_tokens,
                r.spec_tokens, r.spec_accepted, r.draft_forwards, r.spec_probe) == (
            s.start_ns, s.end_ns, s.schedule_ns, s.draft_ns, s.target_ns, s.num_decode_tokens, s.num_prefill_tokens,
            s.num_spec_tokens, s.num_spec_accepted, s.draft_forwards, s.spec_probe)
        assert 0 <= r.schedule_ns + r.draft_ns + r.target_ns <= r.end_ns - r.start_ns
    # Each verification carries its step's draft phase and target forward.
    spec_steps = t[t["spec_tokens"] > 0].reset_index()
    by_step = defaultdict(list)
    for v in f.spec.itertuples(index=False):
        (step,) = spec_steps[(spec_steps["start_ns"] <= v.ts_ns) & (v.ts_ns <= spec_steps["end_ns"])].itertuples()
        by_step[step.step_id].append(v)
        assert (v.draft_ns, v.verify_ns) == (step.draft_ns, step.target_ns)
    assert sum(len(v) for v in by_step.values()) == len(f.spec) > 0
    assert (spec_steps["draft_forwards"] == 3).any()


def test_greedy_tokens_do_not_change_with_probes(probed) -> None:
    tokens, _, _ = probed
    with one_torch_thread():
        plain, _ = _run(EngineConfig(TARGET, block_size=8, num_kv_blocks=64))
    assert tokens == plain


def test_spec_probe_every_is_validated() -> None:
    for bad in (1, -2):
        with pytest.raises(ValueError, match="spec_probe_every"):
            EngineConfig(TARGET, spec_probe_every=bad)
    assert torch.get_num_threads() >= 1


# -- probe runs under async scheduling (EngineConfig.spec_probe_run) -------------------------------------
RUN = 3


def _run_async(late: bool) -> tuple[list[list[int]], list]:
    """The requests above on an engine with async scheduling (on the CPU: the same launches and reads, no
    overlap) and probe runs of RUN; late: with LATE's arrivals (a run meets a waiting request)."""
    config = EngineConfig(TARGET, speculative_model=DRAFT, num_speculative_tokens=3, spec_probe_every=EVERY,
                          spec_probe_run=RUN, async_scheduling=True, block_size=8, num_kv_blocks=64)
    engine = Engine(config)
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
           for p, n in zip(PROMPTS, MAX_TOKENS)]
    stats = []
    while engine.has_unfinished():
        if late and len(stats) in LATE:
            ids.append(engine.add_request(LATE[len(stats)], SamplingParams(temperature=0, max_tokens=12,
                                                                           ignore_eos=True)))
        stats.append(engine.step())
    assert engine.inflight is None and engine.kv.pool.num_in_use == 0
    return [engine.get_output(i).token_ids for i in ids], stats


@pytest.fixture(scope="module")
def runs() -> tuple[list[list[int]], list]:
    with one_torch_thread():
        return _run_async(late=False)


def test_probe_runs_follow_the_stated_rule(runs) -> None:
    """Without arrivals no run is cut short: the plain steps are, at each batch size, runs of RUN pure-decode
    steps starting at the 1st, (N RUN + 1)th ... (a run's later steps counted at their own batch size)."""
    _, stats = runs
    eligible = [s for s in stats if s.num_decode_tokens and (s.spec_probe or s.num_spec_tokens)]
    assert all(not s.num_prefill_tokens for s in eligible)  # no request arrives after the first prefills
    seen: Counter[int] = Counter()
    left, expected = 0, []
    for s in eligible:
        b = len(s.batch)
        if left:
            left -= 1
            expected.append(True)
        else:
            expected.append(seen[b] % (EVERY * RUN) == 0)
            left = RUN - 1 if expected[-1] else 0
        seen[b] += 1
    assert [s.spec_probe for s in eligible] == expected
    assert sum(expected) >= 3 * RUN and len(seen) >= 3  # several runs, several batch sizes
    assert not any(s.spec_probe for s in stats if s not in eligible)


def test_a_run_after_its_first_step_is_launched_ahead_and_nothing_else_is(runs) -> None:
    _, stats = runs
    for prev, s, nxt in zip([None, *stats], stats, [*stats[1:], None]):
        first_of_run = s.spec_probe and not (prev is not None and prev.spec_probe and prev.launched_next)
        assert s.launched_ahead == (s.spec_probe and not first_of_run), s.step_id
        assert s.launched_next == (nxt is not None and nxt.launched_ahead), s.step_id
    steady = [s for s in stats if s.launched_ahead and s.launched_next]
    assert len(steady) >= 3 and all(s.spec_probe for s in steady)


@pytest.mark.parametrize("late", [False, True])
def test_greedy_tokens_do_not_change_with_async_probe_runs(late: bool, runs) -> None:
    """With arrivals a run meets a waiting request (the step after cannot be launched ahead: the run ends)."""
    with one_torch_thread():
        tokens, stats = _run_async(late=True) if late else runs
        plain = _plain_tokens(late)
    assert tokens == plain
    assert any(s.launched_ahead for s in stats) and all(s.spec_probe for s in stats if s.launched_ahead)


def _plain_tokens(late: bool) -> list[list[int]]:
    """The greedy tokens of an engine without a draft, synchronous (LATE's prompts too where late: greedy
    tokens do not depend on when a request arrives)."""
    engine = Engine(EngineConfig(TARGET, block_size=8, num_kv_blocks=64))
    prompts = [*zip(PROMPTS, MAX_TOKENS), *((p, 12) for p in LATE.values() if late)]
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)) for p, n in prompts]
    while engine.has_unfinished():
        engine.step()
    return [engine.get_output(i).token_ids for i in ids]


def test_spec_probe_run_is_validated_and_resolved() -> None:
    with pytest.raises(ValueError, match="spec_probe_run"):
        EngineConfig(TARGET, spec_probe_run=-1)
    assert EngineConfig(TARGET).spec_probe_run == 1
    assert EngineConfig(TARGET, async_scheduling=True).spec_probe_run == 4
    assert EngineConfig(TARGET, async_scheduling=True, spec_probe_run=2).spec_probe_run == 2


class CountsLog(EngineObserver):
    """Each step's expert counts (a copy: the engine reuses its buffers)."""

    wants_expert_counts = True

    def __init__(self) -> None:
        self.counts: dict[int, list[list[int]]] = {}

    def on_expert_counts(self, step_id: int, counts: torch.Tensor) -> None:
        self.counts[step_id] = counts.cpu().tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_async_probe_runs_give_the_synchronous_engines_steps_and_expert_counts(temperature: float) -> None:
    """The same probe runs, synchronous (SpecProbe.runs_plain continues a run) and launched ahead: the same
    steps, tokens and per-step expert counts (the async ones read back through AsyncSteps' own buffers).
    Sampled too: a launched step draws on the device keyed as the synchronous engine keys its draw."""
    out = []
    for is_async in (False, True):
        log = CountsLog()
        config = EngineConfig(TARGET, speculative_model=DRAFT, num_speculative_tokens=3, spec_probe_every=EVERY,
                              spec_probe_run=RUN, async_scheduling=is_async, block_size=8, num_kv_blocks=64)
        with one_torch_thread():
            engine = Engine(config, log)
            ids = [engine.add_request(p, SamplingParams(temperature=temperature, seed=7 + i, max_tokens=n,
                                                        ignore_eos=True))
                   for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]
            stats = []
            while engine.has_unfinished():
                stats.append(engine.step())
        steps = [(s.step_id, tuple(s.batch), s.spec_probe, s.num_spec_tokens) for s in stats]
        out.append((steps, log.counts, [engine.get_output(i).token_ids for i in ids], stats))
    (sync_steps, sync_counts, sync_tokens, sync_stats), (steps, counts, tokens, stats) = out
    assert steps == sync_steps and tokens == sync_tokens
    assert counts == sync_counts and set(counts) == {s.step_id for s in stats}
    assert sum(s.spec_probe for s in sync_stats) >= 3 * RUN and not any(s.launched_ahead for s in sync_stats)
    assert sum(s.launched_ahead for s in stats) >= 2 * (RUN - 1)
