"""serve.engine_loop: post_all's events reach each handler's queue in order, with one
call_soon_threadsafe per event loop, and a closed loop is skipped without raising; the loop's
warm-up (before_steps) runs on the engine thread before start() returns, and a failing one does not
stop it."""
from __future__ import annotations

import asyncio
import threading

from infersight.serve.engine_loop import Accepted, Delta, Submission, post_all


class CountingLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def submission(loop: asyncio.AbstractEventLoop) -> Submission:
    return Submission(prompt="x", record=None, task=None, loop=loop)  # type: ignore[arg-type]


def test_one_wakeup_per_loop_and_each_queue_in_order() -> None:
    loop = CountingLoop()
    a, b = submission(loop), submission(loop)
    posts = [(a, Accepted(1)), (b, Delta("x", 1)), (a, Delta("y", 1)), (a, Delta("z", 2))]
    thread = threading.Thread(target=post_all, args=(posts,))
    thread.start()
    thread.join()

    async def drain(sub: Submission, n: int) -> list[object]:
        return [await sub.events.get() for _ in range(n)]

    got_a = loop.run_until_complete(drain(a, 3))
    got_b = loop.run_until_complete(drain(b, 1))
    loop.close()
    assert loop.threadsafe_calls == 1
    assert got_a == [Accepted(1), Delta("y", 1), Delta("z", 2)]
    assert got_b == [Delta("x", 1)]


def test_a_closed_loop_is_skipped_and_the_others_still_get_theirs() -> None:
    gone, live = asyncio.new_event_loop(), CountingLoop()
    gone.close()
    a, b = submission(gone), submission(live)
    post_all([(a, Delta("lost", 1)), (b, Delta("kept", 1))])
    assert live.run_until_complete(b.events.get()) == Delta("kept", 1)
    live.close()
    assert a.events.qsize() == 0


class _Engine:
    """What EngineLoop reads of an engine before a request: its config and whether work is left."""

    class config:  # noqa: N801 -- the attribute EngineLoop reads
        max_model_len = 64
        model_config = None

    def has_unfinished(self) -> bool:
        return False


def test_before_steps_runs_on_the_engine_thread_and_start_waits_for_it() -> None:
    from infersight.serve.engine_loop import EngineLoop

    ran: list[str] = []
    release = threading.Event()

    def warm() -> None:
        release.wait(5)
        ran.append(threading.current_thread().name)

    loop = EngineLoop(_Engine(), None, before_steps=warm)  # type: ignore[arg-type]
    threading.Timer(0.2, release.set).start()
    loop.start()
    try:
        assert ran == ["infersight-engine"]  # start() returned only once the warm-up had run, there
    finally:
        loop.stop()


def test_a_failing_warm_up_does_not_keep_the_loop_from_serving() -> None:
    from infersight.serve.engine_loop import EngineLoop

    def broken() -> None:
        raise RuntimeError("no profiler here")

    loop = EngineLoop(_Engine(), None, before_steps=broken)  # type: ignore[arg-type]
    loop.start()
    try:
        assert loop.alive
    finally:
        loop.stop()
