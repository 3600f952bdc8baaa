"""How the A/B benches drive their engines (bench.speculation.fixed_batch.step_runs): in turn while every
engine is synchronous, one after another (the order rotated by the round) once one schedules asynchronously."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from infersight.bench.speculation import fixed_batch
from infersight.bench.speculation.fixed_batch import step_runs


class CountedRun:
    """A run of `steps` steps whose engine is async or not; each step appends its name to `log`."""

    def __init__(self, name: str, steps: int, is_async: bool, log: list[str]) -> None:
        self.name, self.left, self.log = name, steps, log
        self.engine = SimpleNamespace(config=SimpleNamespace(async_scheduling=is_async))

    def step(self) -> bool:
        if not self.left:
            return False
        self.left -= 1
        self.log.append(self.name)
        return True


def _drive(async_flags: tuple[bool, bool, bool], first: int, steps: tuple[int, int, int] = (2, 3, 1)
           ) -> tuple[list[str], list[int]]:
    log: list[str] = []
    polls: list[int] = []
    runs = [CountedRun(n, k, a, log) for n, k, a in zip("abc", steps, async_flags)]
    step_runs(runs, first, lambda: polls.append(len(log)))
    return log, polls


def test_synchronous_engines_are_stepped_in_turn() -> None:
    log, polls = _drive((False, False, False), 1)
    # turn 1 starts at b: b c a; turn 2 at c (done): a b; turn 3 at a (done): b; turn 4 steps nobody
    assert log == ["b", "c", "a", "a", "b", "b"]
    assert polls == [3, 5, 6]  # after each turn that stepped someone


@pytest.mark.parametrize("first, order", [(0, "aabbbc"), (1, "bbbcaa"), (2, "caabbb"), (4, "bbbcaa")])
def test_with_an_async_engine_each_runs_alone_in_rotated_order(first: int, order: str) -> None:
    log, polls = _drive((False, True, False), first)
    assert "".join(log) == order
    ends = [order.rindex(x) + 1 for x in dict.fromkeys(order)]
    assert polls == ends  # at each run's end (fewer steps than ALONE_AFTER_EVERY)


def test_running_alone_polls_every_so_many_steps_and_at_the_end() -> None:
    k = fixed_batch.ALONE_AFTER_EVERY
    _, polls = _drive((True, True, True), 0, (2 * k + 5, k, 0))
    assert polls == [k, 2 * k, 2 * k + 5, 3 * k + 5, 3 * k + 5, 3 * k + 5]  # b's own k-th; c: no step, its end
