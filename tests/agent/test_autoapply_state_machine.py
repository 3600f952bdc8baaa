"""The closed loop's decision logic on synthetic samples, with a real control block (no engine): a canary
is kept only when its measured A/B confirms it, rolled back when it shows harm or runs out of time
unconfirmed, and nothing is proposed or decided while the evidence is inconclusive. The engine side
(the loop on the shipped models) is tests/agent/test_autoapply_engine.py."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.autoapply.part import AutoApplyPart
from infersight.agent.autoapply.samples import COLUMNS, RequestSamples
from infersight.agent.autoapply.verdict import arm_verdict, slo_met, slo_verdict
from infersight.config_error import ConfigError
from infersight.correlate.frames import EventFrames
from infersight.probes.control import ControlBlock, control_name
from infersight.probes.policy_block import read_policy, set_configured_max_num_seqs

S = 1_000_000_000
_PARTS: list[AutoApplyPart] = []  # closed by the ring fixture (their writers hold the control block)
ADVICE_OFF = {"task": "creative", "action": "disable_speculation", "speedup": 0.6, "speedup_low": 0.5,
              "speedup_high": 0.7, "basis": "predicted_from_probe_steps", "reason": "slows decode"}


@pytest.fixture()
def ring() -> str:
    name = f"infersight-test-loop-{os.getpid()}"
    block = ControlBlock(control_name(name), create=True)
    set_configured_max_num_seqs(block.shm.buf, 8)
    yield name
    for part in _PARTS:
        part.close()
    _PARTS.clear()
    block.close()


def _part(ring: str, advice: list[dict], **kw: object) -> AutoApplyPart:
    config = AutoApplyConfig(knobs=("speculation",), min_window_s=10, max_window_s=100, min_requests=20,
                             cooldown_s=5, **kw)  # type: ignore[arg-type]
    part = AutoApplyPart(config, lambda: advice, lambda: [ring], clock=lambda: 0)
    _PARTS.append(part)
    return part


def _rows(task: str, arm: int, seq: int, tpot: np.ndarray, t0: int = 0) -> list[tuple]:
    return [(i, task, arm, seq, t0, t0 + S, 10, 0.01, float(v)) for i, v in enumerate(tpot)]


def _feed(part: AutoApplyPart, rows: list[tuple]) -> None:
    part.samples._done.extend(rows)


def _policy(ring: str):
    block = ControlBlock(control_name(ring), create=False)
    try:
        return read_policy(block.shm.buf)
    finally:
        block.close()


def test_arm_verdict_reads_the_interval() -> None:
    rng = np.random.default_rng(0)
    slow, fast = rng.normal(0.020, 0.001, 60), rng.normal(0.010, 0.001, 60)
    assert arm_verdict(slow, fast, rng)["verdict"] == "better"  # treatment (2nd) faster
    assert arm_verdict(fast, slow, rng)["verdict"] == "worse"
    same = arm_verdict(rng.normal(0.01, 0.002, 60), rng.normal(0.01, 0.002, 60), rng)
    assert same["verdict"] == "inconclusive" and same["interval_95_s"][0] < 0 < same["interval_95_s"][1]
    assert arm_verdict(np.empty(0), fast, rng)["verdict"] == "inconclusive"


def test_slo_verdict_and_met() -> None:
    met = slo_met(np.array([0.1, 0.3, 0.1, 0.1]), np.array([0.01, 0.01, 0.05, np.nan]), 0.2, 0.02)
    assert met.tolist() == [True, False, False, True]  # the last: one token, its TTFT alone
    rng = np.random.default_rng(1)
    assert slo_verdict(np.zeros(40, bool), np.ones(40, bool), rng)["verdict"] == "better"
    assert slo_verdict(np.ones(40, bool), np.zeros(40, bool), rng)["verdict"] == "worse"


def test_samples_from_request_events() -> None:
    ev = pd.DataFrame({"ts_ns": [0, 0, 2 * S, 12 * S, 5, 6 * S], "end_ns": 0, "request_id": [1, 1, 1, 1, 2, 2],
                       "trace_id": "", "task": ["code"] * 4 + ["creative"] * 2,
                       "event": ["ARRIVED", "POLICY_ARM", "FIRST_TOKEN", "FINISHED", "ARRIVED", "FINISHED"],
                       "reason": "", "value0": [5, 2, 0, 11, 5, 0], "value1": [0, 7, 0, 0, 0, 0]})
    samples = RequestSamples()
    samples.add(EventFrames(request_events=ev))
    frame = samples.frame()
    assert list(frame.columns) == list(COLUMNS)
    # request 2 never had a first token: no latency, not kept
    assert frame.to_dict("records") == [{"request_id": 1, "task": "code", "arm": 2, "seq": 7, "arrived_ns": 0,
                                         "finished_ns": 12 * S, "output_tokens": 11, "ttft_s": 2.0, "tpot_s": 1.0}]


def test_a_confirmed_change_is_kept(ring: str) -> None:
    part = _part(ring, [ADVICE_OFF])
    part.tick(0)
    stages = [d.stage for d in part.decisions]
    assert stages == ["proposed", "canaried"]
    policy = _policy(ring)
    (task,) = policy.tasks
    assert (task.label, task.speculate, task.old_speculate, task.control_share) == ("creative", False, True, 0.5)
    seq = policy.seq
    rng = np.random.default_rng(2)
    _feed(part, _rows("creative", 2, seq, rng.normal(0.020, 0.002, 30)) + _rows("creative", 1, seq,
                                                                                 rng.normal(0.012, 0.002, 30)))
    part.tick(5 * S)  # inside the minimum window: no verdict yet
    assert [d.stage for d in part.decisions][-1] == "canaried"
    part.tick(11 * S)
    last = list(part.decisions)[-1]
    assert last.stage == "kept" and last.numbers["verdict"] == "better"
    assert last.numbers["interval_95_s"][1] < 0
    (task,) = _policy(ring).tasks
    assert (task.speculate, task.control_share) == (False, 0.0)  # every request now
    part.tick(12 * S)  # cool-down, and nothing more to propose
    assert len(list(part.decisions)) == 3


def test_a_change_that_hurts_is_rolled_back(ring: str) -> None:
    part = _part(ring, [ADVICE_OFF])
    part.tick(0)
    seq = _policy(ring).seq
    rng = np.random.default_rng(3)
    _feed(part, _rows("creative", 2, seq, rng.normal(0.010, 0.001, 30)) + _rows("creative", 1, seq,
                                                                                 rng.normal(0.015, 0.001, 30)))
    part.tick(11 * S)
    last = list(part.decisions)[-1]
    assert last.stage == "rolled_back" and "worse" in last.reason
    assert _policy(ring).tasks == ()  # the engine's default again
    part.tick(30 * S)  # past the cool-down: the same change is not proposed again at once
    assert len(list(part.decisions)) == 3


def test_inconclusive_evidence_changes_nothing(ring: str) -> None:
    inconclusive = {**ADVICE_OFF, "action": "inconclusive", "speedup_high": 1.2}
    part = _part(ring, [inconclusive])
    part.tick(0)
    assert list(part.decisions) == [] and _policy(ring).seq == 0  # nothing proposed, nothing written
    part = _part(ring, [ADVICE_OFF])
    part.tick(0)
    seq = _policy(ring).seq
    rng = np.random.default_rng(4)
    _feed(part, _rows("creative", 2, seq, rng.normal(0.010, 0.002, 30)) + _rows("creative", 1, seq,
                                                                                 rng.normal(0.010, 0.002, 30)))
    for t in (11, 50, 99):
        part.tick(t * S)
        assert [d.stage for d in part.decisions] == ["proposed", "canaried"]  # still measuring
        assert _policy(ring).seq == seq
    part.tick(101 * S)  # the window ran out unconfirmed: back
    last = list(part.decisions)[-1]
    assert last.stage == "rolled_back" and "not confirmed" in last.reason


def test_samples_of_another_generation_or_task_do_not_count(ring: str) -> None:
    part = _part(ring, [ADVICE_OFF])
    part.tick(0)
    seq = _policy(ring).seq
    rng = np.random.default_rng(5)
    _feed(part, _rows("creative", 2, seq + 5, rng.normal(0.02, 0.001, 30))
          + _rows("code", 2, seq, rng.normal(0.02, 0.001, 30)) + _rows("creative", 1, seq, rng.normal(0.01, 0.001, 30)))
    part.tick(11 * S)
    assert list(part.decisions)[-1].stage == "canaried"  # no control arm of its own yet


def test_config_refuses_bad_settings() -> None:
    with pytest.raises(ConfigError, match="--auto-apply-min-window-s"):
        AutoApplyConfig(knobs=("speculation",), min_window_s=10, max_window_s=5)
    with pytest.raises(ConfigError, match="SLO"):
        AutoApplyConfig(knobs=("max-num-seqs",))
    with pytest.raises(ConfigError, match="--auto-apply takes"):
        AutoApplyConfig(knobs=("everything",))
    with pytest.raises(ConfigError, match="--auto-apply-recheck-s"):
        AutoApplyConfig(knobs=("speculation",), recheck_s=0)


def test_the_recheck_flag_and_its_default() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    AutoApplyConfig.add_flags(parser)
    assert AutoApplyConfig.from_args(parser.parse_args(["--auto-apply", "speculation"])).recheck_s == 1800.0
    args = parser.parse_args(["--auto-apply", "speculation", "--auto-apply-recheck-s", "45"])
    assert AutoApplyConfig.from_args(args).recheck_s == 45.0


def _arms(part: AutoApplyPart, ring: str, treatment_tpot: float, control_tpot: float, seed: int) -> int:
    """Feed 30 finished requests per arm of the canary in force (normal around the given means)."""
    seq = _policy(ring).seq
    rng = np.random.default_rng(seed)
    _feed(part, _rows("creative", 2, seq, rng.normal(control_tpot, 0.001, 30))
          + _rows("creative", 1, seq, rng.normal(treatment_tpot, 0.001, 30)))
    return seq


def test_a_disabled_task_is_rechecked_and_re_enabled_only_when_measured_better(ring: str) -> None:
    part = _part(ring, [ADVICE_OFF], recheck_s=100)
    part.tick(0)
    _arms(part, ring, treatment_tpot=0.010, control_tpot=0.020, seed=6)  # off measured better
    part.tick(11 * S)
    assert [d.stage for d in part.decisions] == ["proposed", "canaried", "kept"]
    part.tick(50 * S)
    part.tick(110 * S)  # the advice still says off, and the re-check is due at 11 + 100 s
    assert len(list(part.decisions)) == 3

    part.tick(111 * S)
    proposed, canaried = list(part.decisions)[3:]
    assert (proposed.stage, proposed.before, proposed.after) == ("proposed", False, True)
    assert proposed.numbers["trigger"] == "recheck" and proposed.numbers["off_for_s"] == 100.0
    (task,) = _policy(ring).tasks  # speculation back on for the treatment arm, the control arm stays off
    assert (task.speculate, task.old_speculate, task.control_share) == (True, False, 0.5)
    assert canaried.stage == "canaried" and canaried.policy_seq == _policy(ring).seq
    assert part.decisions.document()["in_flight"]["speculation"] == 1

    _arms(part, ring, treatment_tpot=0.020, control_tpot=0.010, seed=7)  # speculating measured worse
    part.tick(122 * S)
    last = list(part.decisions)[-1]
    assert (last.stage, last.before, last.after) == ("rolled_back", False, True)
    assert last.numbers["verdict"] == "worse" and last.numbers["interval_95_s"][0] > 0
    (task,) = _policy(ring).tasks
    assert (task.speculate, task.control_share) == (False, 0.0)  # stays off, for every request
    part.tick(200 * S)
    part.tick(221 * S)  # the next re-check waits the full interval from the failed one
    assert len(list(part.decisions)) == 6

    part.tick(222 * S)
    assert [(d.stage, d.numbers.get("trigger")) for d in list(part.decisions)[6:]] == [("proposed", "recheck"),
                                                                                       ("canaried", None)]
    _arms(part, ring, treatment_tpot=0.010, control_tpot=0.020, seed=8)  # now speculating is better
    part.tick(233 * S)
    last = list(part.decisions)[-1]
    assert (last.stage, last.after) == ("kept", True) and last.numbers["interval_95_s"][1] < 0
    (task,) = _policy(ring).tasks
    assert (task.speculate, task.control_share) == (True, 0.0)
    assert part.decisions.document()["in_force"]["speculation"] == {"creative": True}
    assert part.speculation.changed_at == {"creative": 233 * S}  # the advice counts creative's steps from here


def test_max_num_seqs_trial_alternates_and_keeps_a_better_limit(ring: str) -> None:
    config = AutoApplyConfig(knobs=("max-num-seqs",), min_requests=20, cooldown_s=0, slo_ttft_s=0.5, slo_itl_s=0.05,
                             seq_window_s=10, seq_windows=4)
    part = AutoApplyPart(config, lambda: [], lambda: [ring], clock=lambda: 0)
    _PARTS.append(part)
    _feed(part, [(i, "code", 0, 0, 0, S, 10, 1.0, 0.01) for i in range(20)])  # all miss the TTFT objective
    part.tick(0)
    assert [d.stage for d in part.decisions] == ["proposed", "canaried"]
    windows = []
    for w in range(4):
        policy = _policy(ring)
        windows.append((policy.max_num_seqs, policy.seq))
        limit, seq = windows[-1]
        ttft = 0.1 if limit == 4 else 1.0  # the candidate (half of 8) meets the SLO, the current does not
        _feed(part, [(i, "code", 0, seq, w * 10 * S, w * 10 * S + S, 10, ttft, 0.01) for i in range(15)])
        part.tick((w + 1) * 10 * S)
    assert [limit for limit, _ in windows] == [4, 8, 4, 8]
    last = list(part.decisions)[-1]
    assert last.stage == "kept" and last.after == 4 and last.numbers["verdict"] == "better"
    assert _policy(ring).max_num_seqs == 4


def test_a_decision_is_a_span_event_when_tracing_is_on() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from infersight.agent.autoapply.decisions import DecisionLog
    from infersight.agent.autoapply.part import span_event_listener

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    log = DecisionLog()
    log.listeners.append(span_event_listener(provider))
    log.record(7, "rolled_back", "speculation", "creative", True, False, "measured worse", {"verdict": "worse"}, 3)
    (span,) = exporter.get_finished_spans()
    assert span.name == "infersight.autoapply.decision"
    (event,) = span.events
    assert event.name == "rolled_back" and event.attributes["infersight.autoapply.target"] == "creative"
    assert event.attributes["infersight.autoapply.change_id"] == 7 and event.attributes["infersight.autoapply.policy_seq"] == 3


def test_after_a_kept_change_the_advice_counts_only_that_tasks_later_verifications() -> None:
    from infersight.agent.autoapply.part import verifications_since

    spec = pd.DataFrame({"ts_ns": [1, 5, 9, 2, 8], "task": ["creative"] * 3 + ["code"] * 2,
                         "accepted": [0, 1, 2, 3, 4]})
    kept = verifications_since(spec, {"creative": 5})  # creative re-enabled at 5: its verifications before describe
    assert kept["accepted"].tolist() == [1, 2, 3, 4]  # speculation that the A/B has since contradicted; code keeps all
    assert verifications_since(spec, {}) is spec and verifications_since(spec.iloc[:0], {"code": 1}).empty


def test_an_inconclusive_recheck_leaves_the_task_off_until_the_window_ends_and_waits_a_full_interval(ring: str) -> None:
    part = _part(ring, [ADVICE_OFF], recheck_s=100)
    part.tick(0)
    _arms(part, ring, treatment_tpot=0.010, control_tpot=0.020, seed=9)
    part.tick(11 * S)  # kept: off
    part.tick(111 * S)  # the re-check
    _arms(part, ring, treatment_tpot=0.010, control_tpot=0.010, seed=10)  # no difference either way
    part.tick(150 * S)
    assert [d.stage for d in part.decisions][-2:] == ["proposed", "canaried"]  # still measuring
    part.tick(211 * S)  # max_window_s (100) after the re-check began: not confirmed, back off
    last = list(part.decisions)[-1]
    assert (last.stage, last.after) == ("rolled_back", True) and "not confirmed" in last.reason
    assert _policy(ring).tasks[0].speculate is False
    part.tick(310 * S)
    assert len(list(part.decisions)) == 6  # the next re-check is due 100 s after this one ended, not began
    part.tick(311 * S)
    assert list(part.decisions)[-2].numbers["trigger"] == "recheck"


def _seq_part(ring: str) -> AutoApplyPart:
    config = AutoApplyConfig(knobs=("max-num-seqs",), min_requests=6, cooldown_s=5, slo_ttft_s=0.3, slo_itl_s=60.0,
                             seq_window_s=4.0, seq_windows=2, seq_candidates=(2,))
    part = AutoApplyPart(config, lambda: [], lambda: [ring], clock=lambda: 0)
    _PARTS.append(part)
    return part


def _cohort(first_id: int, finished_ns: int, ttfts: list[float]) -> list[tuple]:
    """Requests admitted together, finishing in the same step, in the engine's order."""
    return [(first_id + i, "code", 0, 0, finished_ns - S, finished_ns, 6, t, 0.1) for i, t in enumerate(ttfts)]


@pytest.mark.parametrize("history, proposes", [
    # a cohort of 8 finishing in one step, its 2 waiters first: the last 6 finished all met the objective,
    # but the step's two misses are recent (the rule once looked at the last 6 only and never proposed)
    ([_cohort(0, 10 * S, [0.45, 0.45] + [0.11] * 6)], True),
    # the same cohort 10 s before 8 newer requests that all met: a miss outside the window is no reason
    ([_cohort(0, 10 * S, [0.45, 0.45] + [0.11] * 6), _cohort(8, 20 * S, [0.11] * 8)], False),
    # every recent request met the objective: nothing to gain
    ([_cohort(0, 10 * S, [0.11] * 8)], False),
])
def test_a_seq_trial_is_proposed_when_a_request_finished_within_the_window_missed(
        ring: str, history: list[list[tuple]], proposes: bool) -> None:
    part = _seq_part(ring)
    for rows in history:
        _feed(part, rows)
    part.tick(0)
    decisions = [(d.knob, d.stage, d.before, d.after) for d in part.decisions]
    assert decisions == ([("max_num_seqs", "proposed", 8, 2), ("max_num_seqs", "canaried", 8, 2)] if proposes else [])
