"""FinishedRows (frames kept and joined into chunks, dicts built when read) against a deque(maxlen) of
to_dict("records") rows; its byte bound against bytes counted here from the kept frames."""
from __future__ import annotations

import gc
import sys
import tracemalloc
from collections import deque

import numpy as np
import pandas as pd
import pytest

from infersight.agent.rows.finished_rows import FinishedRows, row_dicts
from infersight.agent.rows.row_window import BLOCKS_PER_BUDGET, COMPACT_FRAMES


def _frame(rng: np.random.Generator, first: int, n: int) -> pd.DataFrame:
    ttft = rng.random(n)
    ttft[rng.random(n) < 0.3] = np.nan
    return pd.DataFrame({"request_id": np.arange(first, first + n, dtype=np.int64), "ttft_s": ttft,
                         "task": pd.Series([f"t{i % 3}" for i in range(n)], dtype=object)})


@pytest.mark.parametrize("maxlen", [0, 1, 3, 7, 50, 1000])
def test_same_rows_as_a_bounded_deque(maxlen: int) -> None:
    rng = np.random.default_rng(maxlen)
    kept, reference, first = FinishedRows(maxlen), deque(maxlen=maxlen), 0
    for _ in range(40):
        n = int(rng.integers(0, 9))
        rows = _frame(rng, first, n)
        first += n
        kept.extend_frame(rows)
        reference.extend(rows.to_dict("records"))
        if rng.random() < 0.5:  # read at some polls only: the cache of dicts must not go stale
            assert [r["request_id"] for r in kept] == [r["request_id"] for r in reference]
        assert len(kept) == len(reference) and bool(kept) == bool(reference)
    got, want = list(kept), list(reference)
    assert [r["request_id"] for r in got] == [r["request_id"] for r in want]
    assert [repr(r["ttft_s"]) for r in got] == [repr(r["ttft_s"]) for r in want]
    assert [r["task"] for r in got] == [r["task"] for r in want]
    framed = [v for f in kept.frames() for v in f["request_id"].tolist()]
    assert framed == [r["request_id"] for r in want]
    for n in (0, 1, 5, 23, 10_000):  # the last n, from the newest blocks' arrays and frames: the deque's
        last = [r["request_id"] for r in want][-n:] if n else []
        assert kept.last_values("request_id", n).tolist() == last
        assert repr(kept.last_values("ttft_s", n).tolist()) == repr([r["ttft_s"] for r in want][-n:] if n else [])
        assert (kept.tail(n)["request_id"].tolist() if n and want else []) == last
    if want:
        assert repr(kept[0]) == repr(want[0]) and repr(kept[-1]) == repr(want[-1])


def test_rows_are_a_snapshot() -> None:
    rows = pd.DataFrame({"request_id": np.array([1, 2], np.int64), "ttft_s": [0.5, 0.25]})
    kept = FinishedRows(10)
    kept.extend_frame(rows)
    rows.loc[0, "ttft_s"] = 9.0  # the caller changes its frame after handing it over
    rows["extra"] = 1
    assert list(kept) == [{"request_id": 1, "ttft_s": 0.5}, {"request_id": 2, "ttft_s": 0.25}]


def test_row_dicts_are_to_dict_records() -> None:
    rows = _frame(np.random.default_rng(1), 5, 6)
    assert repr(row_dicts(rows)) == repr(rows.to_dict("records"))


def _objects_bytes(values: np.ndarray) -> int:
    """An array's own bytes, plus sys.getsizeof of every Python object it points to."""
    return values.nbytes + (sum(sys.getsizeof(v) for v in values) if values.dtype == object else 0)


def data_bytes(frame: pd.DataFrame) -> int:
    """A frame's data counted here, not by pandas' memory_usage: per column, an Arrow-backed one's
    buffers (pyarrow's nbytes), a categorical's codes and categories, else its array and the Python
    objects it points to; plus the index's bytes."""
    total = frame.index.nbytes
    for name in frame.columns:
        arr = frame[name].array
        if hasattr(arr, "_pa_array"):  # ArrowStringArray / ArrowExtensionArray: memory in Arrow buffers
            total += arr._pa_array.nbytes
        elif isinstance(arr.dtype, pd.CategoricalDtype):
            total += arr.codes.nbytes + _objects_bytes(np.asarray(arr.categories, dtype=object))
        else:
            total += _objects_bytes(np.asarray(arr))
    return total


@pytest.mark.parametrize("maxlen", [5, 300])
def test_one_row_polls_are_joined_and_still_the_deques_rows(maxlen: int) -> None:
    """A row a poll (the agent at ~13 requests/s): hundreds of appends, joined into chunks (a frame
    costs ~10 KB of its own), still exactly the newest maxlen rows, in order."""
    rng = np.random.default_rng(maxlen)
    kept, reference = FinishedRows(maxlen), deque(maxlen=maxlen)
    for i in range(700):
        rows = _frame(rng, i, 1)
        kept.extend_frame(rows)
        reference.append({"request_id": i})
    assert [r["request_id"] for r in kept] == [r["request_id"] for r in reference]
    assert kept.frame()["request_id"].tolist() == [r["request_id"] for r in reference]
    assert kept.tail(3)["request_id"].tolist() == [r["request_id"] for r in reference][-3:]
    assert kept[-1]["request_id"] == 699 and kept[0]["request_id"] == 700 - maxlen
    assert kept._window.pieces <= COMPACT_FRAMES + maxlen // COMPACT_FRAMES + 2  # not one frame a poll
    assert kept.evicted == 700 - maxlen


def _agent_rows(rng: np.random.Generator, first: int, n: int) -> pd.DataFrame:
    """Rows shaped as the agent's finished requests: 25 numeric columns, a unique trace id, a task
    and a finish reason of a few, slow causes and details (mostly empty, some long)."""
    ids = np.arange(first, first + n, dtype=np.int64)
    cols: dict[str, object] = {"request_id": ids, "trace_id": [f"{rng.integers(1 << 62):032x}" for _ in ids],
                               "task": pd.Series([f"t{i % 3}" for i in ids], dtype="str"),
                               "finish_reason": ["stop" if i % 5 else "length" for i in ids]}
    for k in range(10):
        cols[f"i{k}"] = rng.integers(0, 1 << 40, n)
    for k in range(15):
        cols[f"f{k}"] = rng.random(n)
    cols["slow_cause"] = pd.Series(["" if rng.random() < 0.8 else "queue" for _ in ids], dtype="str")
    cols["slow_detail"] = pd.Series(["" if rng.random() < 0.8 else "x" * int(rng.integers(20, 200)) for _ in ids],
                                    dtype="str")
    return pd.DataFrame(cols)


def _fill(kept: FinishedRows, seed: int, appends: int) -> int:
    rng, first = np.random.default_rng(seed), 0
    for _ in range(appends):
        n = int(rng.integers(1, 4))
        kept.extend_frame(_agent_rows(rng, first, n))
        first += n
    return first


def test_retention_holds_no_more_memory_than_its_byte_budget() -> None:
    """What the process holds for the kept rows, measured by tracemalloc (every allocation the kept
    rows hold, not the code's own count), stays within the budget; the budget is used, the newest
    rows are the ones kept. Before the rows were column blocks, frames joined 64 polls at a time held
    11.5x their counted budget (tracemalloc, the agent's own rows)."""
    budget = 128 << 10
    _fill(FinishedRows(sys.maxsize, budget), 0, 100)  # pandas' and numpy's first-use caches, not the rows'
    kept = FinishedRows(sys.maxsize, budget)
    gc.collect()
    tracemalloc.start()
    try:
        total = _fill(kept, 1, 700)
        ids = kept.frame()["request_id"].tolist()
        counted, evicted = kept.held_bytes, kept.evicted
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        del kept  # what the kept rows hold is what dropping them frees
        gc.collect()
        held = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert ids == list(range(total - len(ids), total))  # the newest, in order
    assert counted <= budget and evicted == total - len(ids) > 0
    assert held <= budget, (held, budget)
    # The budget is used: whole blocks go, each at most 1/BLOCKS_PER_BUDGET of it.
    assert held > budget * (1 - 2 / BLOCKS_PER_BUDGET) * 0.85, (held, budget)
    print(f"\nretention: {len(ids)} rows kept, {held} bytes freed with them (tracemalloc), {counted} counted, "
          f"budget {budget}")


def test_the_agents_retention_stays_within_its_budget_on_a_small_workload() -> None:
    """The agent at its --retention-mib (here 16 KiB): 240 engine-shaped requests through a ring, 8
    a poll; the rows it keeps, counted here, stay within the budget, are the newest requests,
    and the summary says so."""
    from testkit import unique_ring

    from infersight.agent.api import report
    from infersight.agent.config import AgentConfig
    from infersight.agent.rows.retention_config import RetentionConfig
    from infersight.agent.service import Agent
    from infersight.bench.agent import synthetic_workload
    from infersight.probes.config import ProbeConfig
    from infersight.probes.observer import ProbeObserver

    ring, budget, total = unique_ring("retention"), 16 << 10, 240
    probe = ProbeObserver(ProbeConfig(ring_name=ring, nvtx=False))
    agent = Agent(AgentConfig(rings=[ring], port=0, retention=RetentionConfig(rows_bytes=budget)))
    try:
        agent.poll_once()
        step = 0
        for first in range(0, total, 8):
            step = synthetic_workload(probe, 8, 2, first_id=first, first_step=step)
            agent.poll_once()
        finished = agent.state.finished
        held = sum(data_bytes(f) for f in finished.frames())
        ids = finished.frame()["request_id"].tolist()
        summary = report.summary(agent.state)
    finally:
        agent.close()
        probe.close()
    assert summary["requests"] == total  # every request finished and was counted
    assert held <= budget and summary["retention"]["bytes"] <= budget
    assert ids == list(range(total - len(ids), total)) and 0 < len(ids) < total  # the newest, some gone
    assert summary["retention"]["requests"] == len(ids) and summary["retention"]["evicted_requests"] == total - len(ids)
    print(f"\nretention: {len(ids)} of {total} requests kept, {held} bytes counted here, "
          f"{summary['retention']['bytes']} by the agent, budget {budget}")
