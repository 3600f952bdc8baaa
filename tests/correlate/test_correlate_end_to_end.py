"""The correlate analyses on frames decoded from a real (tiny) engine run: MoE target, dense draft,
a KV pool small enough to preempt (by swap and by recompute), probes through the ring."""
from __future__ import annotations

import itertools
import os

import pandas as pd
import pytest
import torch

from infersight.correlate.cost import step_cost_shares
from infersight.correlate.frames import EventFrames, update_labels
from infersight.correlate.kv import block_states
from infersight.correlate.moe import expert_load
from infersight.correlate.requests import PARTS, inter_token_latencies, request_table
from infersight.correlate.speculation import acceptance_by_task
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import LLM, ModelConfig, RequestOutput, SamplingParams

TARGET = ModelConfig("corr-t", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                     max_seq_len=128)
DRAFT = ModelConfig("corr-d", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=128)
NUM_KV_BLOCKS = 32   # 128 / 4: the smallest pool allowed; four requests of up to 84 positions overflow it
_names = itertools.count()


@pytest.fixture(scope="module")
def run() -> tuple[list[RequestOutput], EventFrames]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny matrices: threads only add overhead; restored below
    name = f"infersight-corr-{os.getpid()}-{next(_names)}"
    obs = ProbeObserver(ProbeConfig(ring_name=name, nvtx=False))
    consumer = RingConsumer.attach(name, record_registry())
    try:
        llm = LLM(TARGET, speculative_model=DRAFT, observer=obs, block_size=4, num_kv_blocks=NUM_KV_BLOCKS,
                  cpu_offload_blocks=12, max_num_batched_tokens=64, num_speculative_tokens=3)
        prompts = ["hello world " * 4, "abc", "hello world " * 4 + "xyz", "the quick brown fox jumps over"]
        params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, task="code"),
                  SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, task="chat"),
                  SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, task="chat"),
                  SamplingParams(temperature=0.7, max_tokens=30, ignore_eos=True, task="code")]
        outputs = llm.generate(prompts, params)
        records = consumer.read()
        assert consumer.dropped_seen == 0   # a lossy ring would break the exact checks below
        return outputs, EventFrames.from_records(records, update_labels({}, records))
    finally:
        consumer.close()
        obs.close()
        torch.set_num_threads(threads)


def test_request_table_matches_outputs(run) -> None:
    outputs, f = run
    table = request_table(f.request_events).set_index("request_id")
    assert len(table) == len(outputs)
    assert table["num_preemptions"].sum() > 0   # the scenario must exercise stalls
    for o in outputs:
        row = table.loc[o.request_id]
        assert row.output_tokens == len(o.token_ids)
        assert row.prompt_tokens == len(o.prompt_token_ids)
        assert row.cached_tokens == o.num_cached_tokens
        assert row.num_preemptions == o.num_preemptions
        assert (row.arrival_ns, row.first_scheduled_ns, row.first_token_ns, row.finish_ns) == \
            (o.times.arrival_ns, o.times.first_scheduled_ns, o.times.first_token_ns, o.times.finish_ns)
        # Exact in ns: the parts telescope to finish - arrival.
        parts_ns = sum(round(getattr(row, p) * 1e9) for p in PARTS)
        assert parts_ns == round(row.e2e_s * 1e9) == o.times.finish_ns - o.times.arrival_ns
    # Every output token after the first step's is one ITL sample.
    itl = inter_token_latencies(f.request_events).groupby("request_id").size()
    ev = f.request_events
    first = ev[ev.event == "TOKENS"].sort_values("ts_ns", kind="stable").groupby("request_id")["value0"].first()
    for o in outputs:
        assert itl.get(o.request_id, 0) == len(o.token_ids) - first[o.request_id]


def test_cost_shares_cover_each_step(run) -> None:
    _, f = run
    shares = step_cost_shares(f.steps, f.batch)
    duration = (f.steps.set_index("step_id")["end_ns"] - f.steps.set_index("step_id")["start_ns"])
    got = shares.assign(ns=(shares.engine_seconds * 1e9).round().astype("int64")).groupby("step_id")["ns"].sum()
    assert (got == duration.reindex(got.index)).all()
    assert shares.groupby("step_id")["share"].sum().to_numpy() == pytest.approx(1.0)


def test_moe_counts_top_k_per_fed_token(run) -> None:
    _, f = run
    fed = int(f.batch["num_tokens"].sum())
    per_layer = expert_load(f.moe).groupby("layer")["tokens"].sum()
    assert per_layer.to_dict() == {layer: TARGET.top_k * fed for layer in range(TARGET.n_layers)}
    per_step = f.moe.groupby(["step_id", "layer"])["tokens"].sum().unstack()
    fed_per_step = f.batch.groupby("step_id")["num_tokens"].sum()
    for layer in range(TARGET.n_layers):
        assert (per_step[layer] == TARGET.top_k * fed_per_step.reindex(per_step.index)).all()


def test_spec_accepted_matches_outputs(run) -> None:
    outputs, f = run
    per_request = f.spec.groupby("request_id")[["proposed", "accepted"]].sum()
    for o in outputs:
        got = per_request.loc[o.request_id] if o.request_id in per_request.index else pd.Series({"proposed": 0,
                                                                                                  "accepted": 0})
        assert (int(got.accepted), int(got.proposed)) == (o.num_spec_accepted, o.num_spec_proposed)
    by_task = acceptance_by_task(f.spec)
    assert int(by_task.accepted.sum()) == sum(o.num_spec_accepted for o in outputs)


def test_block_states_replay_matches_pool(run) -> None:
    _, f = run
    # Each step's kv_blocks_in_use is read after its last KV event and before the next step's first.
    for step in f.steps.itertuples(index=False):
        states = block_states(f.kv_events[f.kv_events.ts_ns <= step.end_ns], NUM_KV_BLOCKS)
        assert states["in_use"] == step.kv_blocks_in_use, step.step_id
    assert (f.kv_events.event == "reloaded").any() and (f.kv_events.event == "offloaded").any()


def test_analyses_leave_their_inputs_unchanged(run) -> None:
    from infersight.correlate import (
        cost, kv, moe, prefix, requests, slow_causes, slow_rule, spec_advice, spec_speedup, speculation,
    )

    _, f = run
    before = {name: getattr(f, name).copy(deep=True) for name in
              ("request_events", "steps", "batch", "kv_events", "moe", "spec", "prefix", "step_timing")}
    table = requests.request_table(f.request_events)
    before_table = table.copy(deep=True)
    requests.inter_token_latencies(f.request_events)
    features = slow_causes.slow_features(table, f.request_events, f.steps, f.batch, f.spec, f.kv_events)
    verdicts, window = slow_rule.judge_slow(features, pd.DataFrame(), slow_rule.SlowRule(quantile=0.5, min_requests=1))
    slow_causes.attribute_slow(features[verdicts["slow"].to_numpy()], window)
    moe.layer_imbalance(f.moe), moe.top_pairs(f.moe, 3)
    kv.transition_counts(f.kv_events), kv.block_states(f.kv_events, NUM_KV_BLOCKS), kv.block_lifetimes(f.kv_events)
    prefix.prefix_hit_rates(f.prefix), prefix.top_prefix_groups(f.prefix, 3)
    speculation.acceptance_by_task(f.spec), speculation.acceptance_by_position(f.spec)
    spec_advice.recommendations(spec_speedup.speedup_by_task(f.spec, f.step_timing))
    shares = cost.step_cost_shares(f.steps, f.batch)
    cost.cost_by_task(shares, table), cost.cost_by_request(shares)
    for name, frame in before.items():
        pd.testing.assert_frame_equal(getattr(f, name), frame, obj=name)
    pd.testing.assert_frame_equal(table, before_table)
