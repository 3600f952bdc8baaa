"""kernels.analysis.step_findings: a capture's gaps judged against the engine's own step time, graph
replays told apart, and the memory-bound decode finding. Expected values are computed here by hand
or from the raw trace with the json module (tests/kernels/data/README.md)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from infersight.kernels.analysis.findings import GRAPH_REPLAY_ACTION
from infersight.kernels.readers.load import load_trace
from infersight.kernels.analysis.report import build_report
from infersight.kernels.readers.shapes import load_capture_shapes
from infersight.kernels.analysis.step_findings import (
    bandwidth_finding, graph_launch_share, outside_step_findings, outside_step_times,
)

DATA = Path(__file__).parent / "data"
EAGER = DATA / "kineto_llama-1b-decode-eager-h200"


def phases(window_ns: float, busy_ns: float, steps: int = 20, share: float = 0.99) -> pd.DataFrame:
    return pd.DataFrame([{"phase": "decode", "steps": steps, "activities": 188 * steps, "kernel_ns": busy_ns,
                          "share": share, "window_ns": window_ns, "busy_ns": busy_ns,
                          "idle_ns": window_ns - busy_ns, "idle_share": 1 - busy_ns / window_ns,
                          "mean_kernel_ns": 6000.0}])


def test_gaps_of_a_slowed_capture_are_judged_against_the_step_outside() -> None:
    found, replaced = outside_step_findings(phases(20 * 16e6, 20 * 1.12e6), {"decode": 1.88e6}, graphs=False)
    assert replaced == {"decode"}
    (f,) = found
    assert f.severity == "medium"  # 1 - 1.12 / 1.88 = 40.4%: between the 30% and 50% thresholds
    assert "the GPU idles 40% of the step" in f.text and "1.88 ms" in f.text and "16.00 ms" in f.text


def test_a_gpu_bound_step_outside_gets_no_launch_finding() -> None:
    (f,), _ = outside_step_findings(phases(20 * 16e6, 20 * 1.12e6), {"decode": 1.2e6}, graphs=True)
    assert f.severity == "info" and "busy 93% of the step" in f.text  # 1.12 / 1.2


def test_an_undistorted_capture_keeps_its_own_gaps() -> None:
    found, replaced = outside_step_findings(phases(20 * 2.0e6, 20 * 1.12e6), {"decode": 1.88e6}, graphs=False)
    assert found == [] and replaced == set()  # 2.0 ms < 1.5 x 1.88 ms


def test_graph_launch_share_counts_kernels_of_graph_replays() -> None:
    runtime = pd.DataFrame({"name": ["cudaGraphLaunch", "cudaLaunchKernel"], "correlation": [7, 8]})
    kernels = pd.DataFrame({"category": ["kernel"] * 4 + ["gpu_memcpy"], "correlation": [7, 7, 7, 8, 7]})
    assert graph_launch_share(runtime, kernels) == pytest.approx(0.75)
    assert graph_launch_share(runtime.iloc[1:], kernels) == 0.0


def test_bandwidth_finding_adds_up_the_memory_bound_rows() -> None:
    roof = pd.DataFrame({"op_category": ["GEMM", "attention-decode", "attention-prefill"],
                         "bytes": [2e9, 1e9, 5e9], "kernel_ns": [1e6, 1e6, 1e6], "bound": ["memory", "memory", "compute"],
                         "pct_of_peak_bw": [0.5, 0.25, 1.25]})
    (f,) = bandwidth_finding(roof, captured_steps=2, peak_gbps=4000.0, outside_step_ns=1e6)
    # 3 GB over 2 ms = 1,500 GB/s = 37.5% of 4,000; 1.5 GB per step over a 1 ms step = 37.5% too
    assert f.severity == "medium"
    assert "1.50 GB per step at 1,500 GB/s" in f.text and "38% of the 4,000 GB/s" in f.text
    assert "(GEMM 50%, attention-decode 25%)" in f.text and "1.00 ms step outside the capture, 38% of it" in f.text
    assert bandwidth_finding(roof[roof["bound"] == "compute"], 2, 4000.0, None) == []


def test_outside_step_times_are_the_decode_steps_before_the_capture() -> None:
    steps = pd.DataFrame({"step_id": [1, 2, 3, 4, 5, 6], "start_ns": [0, 10, 20, 30, 40, 50],
                          "end_ns": [9, 13, 24, 35, 99, 99], "prefill_tokens": [512, 0, 0, 0, 0, 0],
                          "decode_tokens": [0, 32, 32, 32, 32, 32]})
    assert outside_step_times(steps, first_step=5) == {"decode": 4.0}  # steps 2-4: 3, 4, 5 ns
    assert outside_step_times(steps, first_step=3) == {}  # one decode step before: too few


def _decode_busy_ns_from_raw(path: Path) -> tuple[int, int]:
    """(GPU ns of kernels launched inside forward.decode ranges, number of such ranges), by hand."""
    events = json.load(gzip.open(path))["traceEvents"]
    ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") == "user_annotation" and e.get("name") == "forward.decode"]
    launches = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and any(a <= e["ts"] <= b for a, b in ranges)}
    busy = sum(round(e["dur"] * 1000) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and e.get("args", {}).get("correlation") in launches)
    return busy, len(ranges)


def test_real_h200_eager_capture_reads_as_host_bound_and_memory_bound() -> None:
    trace = load_trace(EAGER.with_suffix(".json.gz"))
    report = build_report(trace, captured=load_capture_shapes(EAGER.with_suffix(".shapes.json")),
                          outside_step_ns={"decode": 1.9e6})
    busy, steps = _decode_busy_ns_from_raw(EAGER.with_suffix(".json.gz"))
    assert steps == 2
    texts = [f["text"] for f in report["findings"]]
    assert not any("is launch-bound" in t for t in texts)  # the eager, profiled gaps (93%) are not the engine's
    idle = 1 - busy / steps / 1.9e6
    assert any(f"the GPU idles {100 * idle:.0f}% of the step" in t for t in texts), texts
    assert any(t.startswith("decode is memory-bound") for t in texts)
    assert report["graph_launch_share"] == 0.0  # these steps ran eagerly under the profiler


def test_without_the_step_outside_the_capture_keeps_its_launch_finding() -> None:
    trace = load_trace(EAGER.with_suffix(".json.gz"))
    report = build_report(trace)
    (f,) = [f for f in report["findings"] if "is launch-bound" in f["text"]]
    assert f["action"] != GRAPH_REPLAY_ACTION  # eager launches: the graph advice stays


GRAPHS = DATA / "kineto_llama-1b-decode-graphs-h200"


def test_real_h200_graph_replay_capture_is_memory_bound_not_launch_bound() -> None:
    events = json.load(gzip.open(GRAPHS.with_suffix(".json.gz")))["traceEvents"]
    graph_ids = {e["args"]["correlation"] for e in events if e.get("name") == "cudaGraphLaunch"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    expected_share = sum(e["args"].get("correlation") in graph_ids for e in kernels) / len(kernels)
    trace = load_trace(GRAPHS.with_suffix(".json.gz"))
    report = build_report(trace, captured=load_capture_shapes(GRAPHS.with_suffix(".shapes.json")),
                          outside_step_ns={"decode": 1.5e6})
    assert report["graph_launch_share"] == pytest.approx(expected_share) and expected_share > 0.95
    texts = [f["text"] for f in report["findings"]]
    assert not any("launch-bound" in t or "idles" in t for t in texts), texts
    assert any(t.startswith("decode is memory-bound") for t in texts)


def test_graph_replays_and_eager_steps_get_the_same_category_shares() -> None:
    """The same kernels (the runtime keeps graph and eager steps identical): by name under graphs,
    by range and name when eager, the categories must agree (RoPE / KV write count as attention)."""
    def shares(stem: Path) -> dict[str, float]:
        return {c["name"]: c["share"] for c in build_report(load_trace(stem.with_suffix(".json.gz")))["categories"]}

    eager, graphs = shares(EAGER), shares(GRAPHS)
    assert "other" not in graphs
    for category in set(eager) | set(graphs):
        assert abs(eager.get(category, 0.0) - graphs.get(category, 0.0)) < 0.01, (category, eager, graphs)


def test_the_agent_judges_a_capture_against_the_steps_before_it() -> None:
    """agent.service.analyze_capture with the engine's STEP records: the decode steps before the
    capture (3 ns, 4 ns, 5 ns... scaled to ms here) set outside_step_ns; prefill and later steps do not."""
    from infersight.agent.service import analyze_capture
    from infersight.correlate.frames import EventFrames

    first = load_capture_shapes(EAGER.with_suffix(".shapes.json")).first_step
    ids = list(range(first - 5, first + 3))
    durations = [9e6, 1.8e6, 1.9e6, 2.0e6, 1.9e6, 50e6, 50e6, 50e6]  # a prefill, 4 decode steps, then the capture
    steps = pd.DataFrame({"step_id": ids, "start_ns": [i * 100_000_000 for i in range(8)],
                          "end_ns": [i * 100_000_000 + int(d) for i, d in enumerate(durations)],
                          "prefill_tokens": [512, 0, 0, 0, 0, 0, 0, 0], "decode_tokens": [0] + [32] * 7})
    report, _ = analyze_capture(str(EAGER.with_suffix(".json.gz")), EventFrames().batch, first, steps)
    assert report["outside_step_ns"] == {"decode": 1.9e6}  # median of 1.8, 1.9, 2.0, 1.9 ms
    assert not any("is launch-bound" in f["text"] for f in report["findings"])
