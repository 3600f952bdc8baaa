"""The run-time policy through the control block (probes.policy_block): what the agent's writer puts
there, the engine takes at its next step or request, acknowledges, and obeys (scheduler limit, per-task
speculation with its canary arm recorded as a POLICY_ARM request event)."""
from __future__ import annotations

import numpy as np
from testkit import one_torch_thread, unique_ring

from infersight.agent.autoapply.policy_writer import PolicyWriter
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.policy_block import TaskPolicy, read_ack
from infersight.probes.records import RecordKind, RequestEvent, record_registry
from infersight.probes.ring_consumer import RingConsumer
from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams
from infersight.runtime.engine.run_policy import PolicyArm, RunPolicy

TINY = ModelConfig("t", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
DRAFT = ModelConfig("d", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=64)


def test_arms_follow_the_share() -> None:
    policy = RunPolicy(1, 0, (TaskPolicy("creative", False, True, 0.25),))
    draws = np.random.default_rng(0).random(4000)
    arms = [policy.arm("creative", d) for d in draws]
    control = sum(a is PolicyArm.CONTROL for _, a in arms) / len(arms)
    assert abs(control - 0.25) < 0.03
    assert all(s is (a is PolicyArm.CONTROL) for s, a in arms)  # control keeps speculating, treatment not
    assert policy.arm("code", 0.1) == (None, PolicyArm.NONE)
    assert RunPolicy(max_num_seqs=0).seq_limit(8) == 8 and RunPolicy(max_num_seqs=3).seq_limit(8) == 3
    assert RunPolicy(max_num_seqs=99).seq_limit(8) == 8  # only ever lowered


def test_the_engine_takes_the_agents_policy() -> None:
    ring = unique_ring("policy")
    probe = ProbeObserver(ProbeConfig(ring_name=ring))
    engine = Engine(EngineConfig(model=TINY, speculative_model=DRAFT, num_speculative_tokens=2, max_num_seqs=8,
                                 num_kv_blocks=64, block_size=8), probe)
    writer = PolicyWriter(lambda: [ring])
    consumer = RingConsumer.attach(ring, record_registry())
    try:
        assert writer.writable and writer.configured_max_num_seqs() == 8
        writer.max_num_seqs = 2
        writer.tasks["creative"] = TaskPolicy("creative", False, True, 0.0)
        seq = writer.publish()
        with one_torch_thread():
            rids = [engine.add_request("hello world", SamplingParams(max_tokens=6, ignore_eos=True,
                                                                     task=("creative", "code")[i % 2]))
                    for i in range(6)]
            batches = []
            while engine.has_unfinished():
                batches.append(len(engine.step().batch))
        assert read_ack(probe.control.shm.buf) == seq and writer.acknowledged()
        assert max(batches) == 2 and engine.scheduler.max_num_seqs == 2
        for rid in rids:
            req = engine.requests[rid]
            assert req.params.use_speculation == (req.task == "code")
            assert (req.num_spec_proposed > 0) == (req.task == "code")
        records = consumer.read()
        req_records = records[int(RecordKind.REQUEST)]
        arm_records = req_records[req_records["event"] == RequestEvent.POLICY_ARM]
        got = {int(r["request_id"]): (int(r["value0"]), int(r["value1"])) for r in arm_records}
        assert got == {rid: (int(PolicyArm.TREATMENT if i % 2 == 0 else PolicyArm.NONE), seq)
                       for i, rid in enumerate(rids)}
    finally:
        writer.close()
        consumer.close()
        probe.close()
