"""scheduler_delay_factor (vLLM's flag): waiting requests are admitted only once the oldest has waited
factor x the last prefill step, or when nothing runs. A hand-driven clock; the expected admissions
are worked out by hand from the rule in each case."""
from __future__ import annotations

import pytest
import torch

from infersight.runtime.config import EngineConfig
from infersight.runtime.engine.request import Request
from infersight.runtime.engine.sampling import SamplingParams
from infersight.runtime.engine.scheduler import Scheduler
from infersight.runtime.kv.kv_cache import KVCacheManager
from infersight.runtime.observer import EngineObserver

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def scheduler(factor: float) -> tuple[Scheduler, Clock]:
    config = EngineConfig(model="tiny-moe", scheduler_delay_factor=factor, num_kv_blocks=64, max_model_len=128)
    observer = EngineObserver()
    clock = Clock()
    return Scheduler(config, KVCacheManager(config, observer), observer, clock), clock


def request(rid: int, arrival_ns: int) -> Request:
    return Request(rid, [1, 2, 3, 4], SamplingParams(max_tokens=8), torch.Generator(), arrival_ns)


def prefill_done(out) -> None:  # noqa: ANN001 -- what the engine's commit does for a prefill step
    for s in out.scheduled:
        s.req.num_computed += s.num_new_tokens
        s.req.output_token_ids.append(7)


def admitted(out) -> list[int]:  # noqa: ANN001
    return [s.req.request_id for s in out.scheduled if s.req.times.first_scheduled_ns is not None
            and s.num_new_tokens > 1]


def test_the_first_request_is_admitted_at_once_when_nothing_runs() -> None:
    sched, clock = scheduler(2.0)
    sched.add(request(0, 0))
    assert admitted(sched.schedule()) == [0]


def test_a_late_arrival_waits_factor_times_the_last_prefill_step() -> None:
    sched, clock = scheduler(2.0)
    sched.add(request(0, 0))
    prefill_done(sched.schedule())          # t=0: admits 0
    clock.ns = 10 * MS                      # the prefill step took 10 ms
    sched.add(request(1, 10 * MS))
    out = sched.schedule()                  # 0 ms waited < 2 x 10 ms: decode of 0 only
    assert sched.last_prefill_ns == 10 * MS
    assert [(s.req.request_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1)]
    clock.ns = 29 * MS                      # 19 ms waited: still closed
    assert not sched.admission_open(clock.ns)
    assert [s.req.request_id for s in sched.schedule().scheduled] == [0]
    clock.ns = 30 * MS                      # 20 ms waited: open, and 2 (arrived meanwhile) comes too
    sched.add(request(2, 25 * MS))
    out = sched.schedule()
    assert [(s.req.request_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1), (1, 4), (2, 4)]


def test_factor_zero_admits_at_every_step() -> None:
    sched, clock = scheduler(0.0)
    sched.add(request(0, 0))
    prefill_done(sched.schedule())
    clock.ns = 10 * MS
    sched.add(request(1, 10 * MS))
    assert [(s.req.request_id, s.num_new_tokens) for s in sched.schedule().scheduled] == [(0, 1), (1, 4)]


def test_the_lookahead_goes_on_while_admission_is_closed() -> None:
    """Async scheduling launches the next decode step ahead unless someone could be admitted: with the
    delay not passed, nobody can, so the decode step is planned ahead."""
    sched, clock = scheduler(2.0)
    sched.add(request(0, 0))
    prefill_done(sched.schedule())
    clock.ns = 10 * MS
    sched.schedule()                        # measures the 10 ms prefill step
    sched.add(request(1, 10 * MS))
    assert [s.req.request_id for s in sched.schedule_lookahead(sched.running)] == [0]
    clock.ns = 30 * MS
    assert sched.schedule_lookahead(sched.running) is None


@pytest.mark.parametrize("bad", [-1.0, 1001.0])
def test_a_bad_factor_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="scheduler_delay_factor"):
        EngineConfig(model="tiny-moe", scheduler_delay_factor=bad)
