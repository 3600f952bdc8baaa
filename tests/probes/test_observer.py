"""ProbeObserver end to end: engine callbacks -> records in the shared-memory ring -> decoded."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from infersight.probes.config import ProbeConfig, TaskLabels
from infersight.probes.observer import ProbeObserver, make_observer
from infersight.probes.records import (
    FinishReason, PreemptReason, RecordKind, RequestEvent, join_trace_id, record_registry,
)
from infersight.probes.ring import RingConsumer
from infersight.runtime import LLM, Engine, EngineConfig, KVBlockEvent, ModelConfig, SamplingParams
from infersight.runtime.engine import step_rows as engine_module  # the rows' sample, sample_batch and verify
from infersight.runtime.stats import StepStats

_names = itertools.count()

TINY_MOE = ModelConfig("test-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                       n_experts=4, top_k=2, max_seq_len=64)
TINY_DRAFT = ModelConfig("test-draft", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32,
                         max_seq_len=64)


@pytest.fixture
def probe():
    obs = ProbeObserver(ProbeConfig(ring_name=f"infersight-test-{next(_names)}-{id(object())}"))
    consumer = RingConsumer.attach(obs.ring_name, record_registry())
    yield obs, consumer
    consumer.close()
    obs.close()


def drain(consumer: RingConsumer) -> dict[RecordKind, np.ndarray]:
    return {RecordKind(k): v for k, v in consumer.read().items()}


def test_every_record_type_round_trips(probe):
    obs, consumer = probe
    trace = (0x0123456789ABCDEF << 64) | 0xFEDCBA9876543210
    obs.on_request_arrived(7, 100, 12, "code", trace)
    obs.on_request_scheduled(7, 110, 12, 8, 0xABC)
    obs.on_prefill_chunk(7, 120, 130, 8, 4)
    obs.on_first_token(7, 131)
    obs.on_tokens_emitted(7, 140, 3)
    obs.on_request_preempted(7, 150, "swap")
    obs.on_request_resumed(7, 160)
    obs.on_spec_verified(7, 4, 2, [True, True, False], 1000, 2000)
    obs.on_request_finished(7, 170, "length", 9)
    obs.on_kv_block(KVBlockEvent.EVICTED, 5, -1, 0x1234)
    obs.on_expert_counts(3, torch.tensor([[1, 2, 3], [4, 5, 6]]))
    obs.on_step_end(StepStats(3, 200, 300, num_prefill_tokens=4, num_decode_tokens=2, num_spec_tokens=4,
                              num_spec_accepted=2, kv_blocks_in_use=6, kv_blocks_cached=3, kv_blocks_total=16, kv_block_size=4, num_waiting=1,
                              num_running=2, num_swapped=0, num_preempted=1, batch=[(7, 5), (8, 1)],
                              finished=[8]))
    got = drain(consumer)

    req = got[RecordKind.REQUEST]
    assert req["event"].tolist() == [RequestEvent.ARRIVED, RequestEvent.SCHEDULED, RequestEvent.PREFILL_CHUNK,
                                     RequestEvent.FIRST_TOKEN, RequestEvent.TOKENS, RequestEvent.PREEMPTED,
                                     RequestEvent.RESUMED, RequestEvent.FINISHED]
    assert req["ts_ns"].tolist() == [100, 110, 120, 131, 140, 150, 160, 170]
    assert req["end_ns"][2] == 130 and req["value0"][2] == 4 and req["value1"][2] == 8
    assert req["value0"][0] == 12 and req["value1"][1] == 8 and req["value0"][4] == 3
    assert req["reason"][5] == PreemptReason.SWAP and req["reason"][7] == FinishReason.LENGTH
    assert req["value0"][7] == 9
    assert all(join_trace_id(h, lo) == trace for h, lo in zip(req["trace_hi"], req["trace_lo"]))
    assert set(req["request_id"].tolist()) == {7}
    assert set(req["task_id"].tolist()) == {1}
    assert got[RecordKind.TASK_LABEL]["label"].tolist() == [b"code"]
    assert got[RecordKind.TASK_LABEL]["task_id"].tolist() == [1]

    prefix = got[RecordKind.PREFIX][0]
    assert (prefix["request_id"], prefix["prompt_tokens"], prefix["cached_tokens"], prefix["group_hash"]) == (7, 12, 8, 0xABC)
    kv = got[RecordKind.KV_BLOCK][0]
    assert (kv["event"], kv["block_id"], kv["request_id"], kv["block_hash"]) == (KVBlockEvent.EVICTED, 5, -1, 0x1234)
    spec = got[RecordKind.SPEC][0]
    assert (spec["proposed"], spec["accepted"], spec["accept_mask"], spec["draft_ns"], spec["verify_ns"]) == (4, 2, 0b011, 1000, 2000)
    assert spec["task_id"] == 1
    moe = got[RecordKind.MOE]
    assert moe["layer"].tolist() == [0, 1] and moe["n_experts"].tolist() == [3, 3]
    assert moe["counts"][:, :3].tolist() == [[1, 2, 3], [4, 5, 6]] and not moe["counts"][:, 3:].any()
    step = got[RecordKind.STEP][0]
    assert (step["step_id"], step["start_ns"], step["end_ns"], step["prefill_tokens"], step["decode_tokens"],
            step["spec_tokens"], step["spec_accepted"], step["kv_blocks_in_use"], step["kv_blocks_cached"],
            step["kv_blocks_total"], step["kv_block_size"],
            step["waiting"], step["running"], step["swapped"], step["preempted"], step["batch_size"],
            step["finished"]) == (3, 200, 300, 4, 2, 4, 2, 6, 3, 16, 4, 1, 2, 0, 1, 2, 1)
    members = got[RecordKind.BATCH_MEMBER]
    assert members[["step_id", "request_id", "num_tokens"]].tolist() == [(3, 7, 5), (3, 8, 1)]
    assert consumer.stats()["dropped"] == 0


def test_moe_layer_with_more_experts_than_one_record_spans_records(probe):
    obs, consumer = probe
    counts = torch.arange(2 * 70).reshape(2, 70)
    obs.on_expert_counts(1, counts)
    moe = drain(consumer)[RecordKind.MOE]
    assert moe[["layer", "expert_offset"]].tolist() == [(0, 0), (0, 64), (1, 0), (1, 64)]
    assert moe["counts"][1, :6].tolist() == list(range(64, 70)) and not moe["counts"][1, 6:].any()
    assert moe["counts"][2, :64].tolist() == list(range(70, 134))


def test_moe_records_reused_across_steps_carry_only_their_own_counts(probe):
    # The records of a step are built in reused buffers: a step with fewer experts, fewer layers or
    # smaller counts than the one before must not show any of the earlier step's values.
    obs, consumer = probe
    obs.on_expert_counts(1, torch.arange(1, 2 * 70 + 1).reshape(2, 70))
    obs.on_expert_counts(2, torch.tensor([[7, 0, 9], [0, 0, 1]]))
    obs.on_expert_counts(3, torch.tensor([[5, 6, 7]]))
    obs.on_expert_counts(4, torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1]]))
    obs.on_expert_counts(5, torch.tensor([[2, 3]]))  # same record layout as step 4, fewer experts
    moe = drain(consumer)[RecordKind.MOE]
    rows = [(int(r["step_id"]), int(r["layer"]), int(r["expert_offset"]), int(r["n_experts"]),
             r["counts"].tolist()) for r in moe]
    pad = [0] * 61
    assert rows[4:] == [(2, 0, 0, 3, [7, 0, 9] + pad), (2, 1, 0, 3, [0, 0, 1] + pad), (3, 0, 0, 3, [5, 6, 7] + pad),
                        (4, 0, 0, 8, [1] * 8 + [0] * 56), (5, 0, 0, 2, [2, 3] + [0] * 62)]
    assert [r[:3] for r in rows[:4]] == [(1, 0, 0), (1, 0, 64), (1, 1, 0), (1, 1, 64)]
    assert rows[3][4] == list(range(135, 141)) + [0] * 58


def test_a_moe_count_too_large_for_its_record_is_coerced_and_counted(probe):
    obs, consumer = probe
    obs.on_expert_counts(4, torch.tensor([[2**33, 1]]))
    moe = drain(consumer)[RecordKind.MOE]
    assert moe["counts"][0, :2].tolist() == [2**32 - 1, 1]
    assert sum(n for key, n in obs.encode_fixes.items() if key.startswith("MOE")) == 1


def test_task_labels_are_bounded():
    labels = TaskLabels(allowed=None, max_labels=2)
    assert labels.intern("code") == (1, True)
    assert labels.intern("json") == (2, True)
    assert labels.intern("chat") == (0, False)   # over the bound: "other"
    assert labels.intern("code") == (1, False)
    assert labels.intern(None) == (0, False)
    allowed = TaskLabels(allowed=("code",), max_labels=32)
    assert allowed.intern("json") == (0, False)
    assert allowed.intern("code") == (1, True)


PROMPTS = ["the quick brown fox jumps over", "def f(x):\n    return", '{"a": 1, "b": [', "zq"]


def _generate(observer):
    llm = LLM(TINY_MOE, speculative_model=TINY_DRAFT, num_speculative_tokens=3, observer=observer)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_tokens_identical_with_probes_off_nvtx_only_and_all(probe):
    obs, consumer = probe
    off = _generate(make_observer(None))
    nvtx_only = _generate(make_observer(ProbeConfig(events=False)))
    all_probes = _generate(obs)
    assert off == nvtx_only == all_probes
    assert len(drain(consumer)[RecordKind.STEP]) > 0


def test_moe_counts_equal_a_count_of_the_routers_topk(probe):
    obs, consumer = probe
    engine = Engine(EngineConfig(model=TINY_MOE, seed=3), obs)
    expected: dict[tuple[int, int], np.ndarray] = {}

    def hook(layer_idx):
        def record(module, inputs, logits):
            # Independent of moe.route: take the top-k of the router logits directly (softmax is monotone).
            top = torch.topk(logits.float(), TINY_MOE.top_k, dim=-1).indices.flatten()
            key = (engine.step_id, layer_idx)
            expected[key] = expected.get(key, np.zeros(TINY_MOE.n_experts, np.int64)) + np.bincount(
                top.numpy(), minlength=TINY_MOE.n_experts)
        return record

    for i, layer in enumerate(engine.target.model.layers):
        layer.ffn.router.register_forward_hook(hook(i))
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    moe = drain(consumer)[RecordKind.MOE]
    got = {(int(r["step_id"]), int(r["layer"])): r["counts"][:TINY_MOE.n_experts].astype(np.int64) for r in moe}
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key].tolist() == expected[key].tolist(), key


def test_scripted_kv_scenario_gives_the_exact_event_sequence(probe):
    """block_size 4, 16 blocks. Derivation:
    A (9 tokens) takes 0,1,2; finishes: 2 is partial -> FREED, 1 and 0 full -> CACHED (tail first).
    B (same prompt) hits 0,1 and takes 3 (uncached free list is now [3..15, 2]); releases 3,1,0.
    C (61 other tokens) needs 16 blocks: the 14 uncached ones [4..15, 2, 3], then evicts the LRU
    cached blocks 1 then 0. C releases tail first: 0 (partial) FREED, then 1, 3, 2, 15..4 CACHED.
    D (A's prompt again) finds nothing cached (A's blocks were evicted): takes 0 (uncached), then
    evicts 1 and 3; registering its two full blocks refills evicted content: RECOMPUTED 0, 1."""
    obs, consumer = probe
    cfg = EngineConfig(model=TINY_MOE, block_size=4, num_kv_blocks=16, seed=0)
    engine = Engine(cfg, obs)
    prompt_a = list(range(10, 19))
    prompt_c = list(range(100, 161))
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    E = KVBlockEvent
    expected = []
    for prompt, events in [
        (prompt_a, [(E.ALLOCATED, 0), (E.ALLOCATED, 1), (E.ALLOCATED, 2), (E.FREED, 2), (E.CACHED, 1), (E.CACHED, 0)]),
        (prompt_a, [(E.PREFIX_HIT, 0), (E.PREFIX_HIT, 1), (E.ALLOCATED, 3), (E.FREED, 3), (E.CACHED, 1), (E.CACHED, 0)]),
        (prompt_c, [(E.ALLOCATED, b) for b in [*range(4, 16), 2, 3]]
         + [(E.EVICTED, 1), (E.ALLOCATED, 1), (E.EVICTED, 0), (E.ALLOCATED, 0), (E.FREED, 0)]
         + [(E.CACHED, b) for b in [1, 3, 2, *range(15, 3, -1)]]),
        (prompt_a, [(E.ALLOCATED, 0), (E.EVICTED, 1), (E.ALLOCATED, 1), (E.EVICTED, 3), (E.ALLOCATED, 3),
                    (E.RECOMPUTED, 0), (E.RECOMPUTED, 1), (E.FREED, 3), (E.CACHED, 1), (E.CACHED, 0)]),
    ]:
        engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
        expected += events
    kv = drain(consumer)[RecordKind.KV_BLOCK]
    got = [(E(int(r["event"])), int(r["block_id"])) for r in kv]
    assert got == expected


def test_accept_bitmask_and_counts_equal_the_verifiers_decisions(probe, monkeypatch):
    obs, consumer = probe
    decisions = []
    real_verify = engine_module.verify

    def recording_verify(draft_tokens, draft_probs, target_probs, generator, greedy):
        # Greedy decisions, recomputed from the verifier's inputs: accept while argmax matches.
        mask = []
        for i, x in enumerate(draft_tokens):
            mask.append(int(target_probs[i].argmax()) == x)
            if not mask[-1]:
                break
        decisions.append((len(draft_tokens), sum(mask) if all(mask) else len(mask) - 1, mask))
        return real_verify(draft_tokens, draft_probs, target_probs, generator, greedy)

    monkeypatch.setattr(engine_module, "verify", recording_verify)
    _generate(obs)
    spec = drain(consumer)[RecordKind.SPEC]
    assert len(spec) == len(decisions) > 0
    for rec, (proposed, accepted, mask) in zip(spec, decisions):
        assert rec["proposed"] == proposed
        assert rec["accepted"] == accepted
        assert rec["accept_mask"] == sum(1 << i for i, ok in enumerate(mask) if ok)


def test_a_label_in_use_is_announced_again_after_its_interval():
    """An agent attaching after the first TASK_LABEL (restarted, or after another reader drained the
    ring) must learn the label before a request uses it: the vLLM traces module read task "other"."""
    now = [0]
    labels = TaskLabels(allowed=None, max_labels=8, clock_ns=lambda: now[0])
    assert labels.intern("code") == (1, True)
    now[0] = 4_999_999_999
    assert labels.intern("code") == (1, False)          # 5 s not yet passed
    now[0] = 5_000_000_000
    assert labels.intern("code") == (1, True)           # announced again, same id
    assert labels.intern("code") == (1, False)
    assert labels.intern("json") == (2, True)
