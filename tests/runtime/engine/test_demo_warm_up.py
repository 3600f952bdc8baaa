"""infersight.demo.warm_up: before the workload, every batch size 1, 2, 4, ... max_num_seqs runs
(prefill, and decode or verify), every warm-up request is released, and an observer switched in
after it sees none of them."""
from __future__ import annotations

import dataclasses

from infersight.bench.engine.switch import SwitchObserver
from infersight.demo import DemoConfig, demo_engine_config, warm_up
from infersight.runtime import Engine
from infersight.runtime.observer import EngineObserver
from tests.testkit import one_torch_thread


class Arrivals(EngineObserver):
    def __init__(self) -> None:
        self.arrived: list[int] = []

    def on_request_arrived(self, request_id: int, t_ns: int, num_prompt_tokens: int, task: str | None,
                           trace_id: int) -> None:
        self.arrived.append(request_id)


def test_warm_up_runs_every_batch_size_and_leaves_nothing_behind() -> None:
    with one_torch_thread():
        config = dataclasses.replace(demo_engine_config(DemoConfig(), "cpu"), max_num_seqs=8)
        seen = Arrivals()
        switch = SwitchObserver({"off": EngineObserver(), "probes": seen}, initial="off")
        engine = Engine(config, switch)
        sizes: set[int] = set()
        step = engine.step

        def counting_step():  # noqa: ANN202
            stats = step()
            if stats.phase in ("decode", "verify"):
                sizes.add(len(stats.batch))
            return stats

        engine.step = counting_step
        warm_up(engine, max_tokens=3)
        switch.select("probes")
    assert {1, 2, 4, 8} <= sizes
    assert engine.requests == {} and not engine.has_unfinished()
    assert seen.arrived == []
    engine.add_request([5, 6, 7], None)
    assert seen.arrived == [engine.next_request_id - 1]  # the workload's requests are seen
