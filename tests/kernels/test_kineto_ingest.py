"""Kineto JSON -> frames, checked against counts and sums taken from the raw JSON."""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import pytest

from infersight.kernels.frames import KERNEL_COLUMNS, RANGE_COLUMNS, RUNTIME_COLUMNS
from infersight.kernels.readers.kineto import load_kineto, parse_kineto, us_to_ns

Events = Callable[[Path], list[dict[str, Any]]]


def _expected(events: list[dict[str, Any]], cat: str) -> tuple[int, int]:
    rows = [e for e in events if e.get("ph") == "X" and e.get("cat") == cat]
    return len(rows), int(sum(Decimal(e["dur"]) for e in rows) * 1000)


@pytest.mark.parametrize("name", ["kineto_hta_param_alexnet_a100.json.gz", "kineto_hta_param_torch_add_a100.json.gz"])
def test_public_kineto_counts_and_times(name: str, shared_fixture: Callable[[str], Path],
                                        kineto_events: Events) -> None:
    path = shared_fixture(name)
    events = kineto_events(path)
    trace = load_kineto(path)
    k = trace.kernels
    assert list(k.columns) == list(KERNEL_COLUMNS)
    for cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        count, total = _expected(events, cat)
        rows = k[k["category"] == cat]
        assert (len(rows), int(rows["dur_ns"].sum())) == (count, total), cat
    assert k["ts_ns"].is_monotonic_increasing
    # Every kernel in these traces carries its launch's correlation id.
    corr = {e["args"]["correlation"] for e in events if e.get("cat") == "kernel"}
    assert set(k.loc[k["category"] == "kernel", "correlation"]) == corr
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    assert len(trace.ranges) == len(annotations)
    assert list(trace.ranges.columns) == list(RANGE_COLUMNS)
    assert list(trace.runtime.columns) == list(RUNTIME_COLUMNS)
    assert trace.devices and all("A100" in d for d in trace.devices)


def test_our_kineto_counts_and_times(our_capture: Any) -> None:
    k = our_capture.trace.kernels
    for cat in ("kernel", "gpu_memcpy"):
        count, total = _expected(our_capture.events, cat)
        rows = k[k["category"] == cat]
        assert (len(rows), int(rows["dur_ns"].sum())) == (count, total), cat
    # grid / block come through as "(x,y,z)"; copies carry bytes instead.
    first = next(e for e in our_capture.events if e.get("cat") == "kernel")
    row = k[(k["correlation"] == first["args"]["correlation"]) & (k["category"] == "kernel")].iloc[0]
    assert row["grid"] == "({},{},{})".format(*first["args"]["grid"])
    assert row["block"] == "({},{},{})".format(*first["args"]["block"])
    copies = [e for e in our_capture.events if e.get("cat") == "gpu_memcpy"]
    assert int(k.loc[k["category"] == "gpu_memcpy", "bytes"].sum()) == sum(e["args"]["bytes"] for e in copies)
    # Runtime calls: one row per correlation id.
    launches = {e["args"]["correlation"] for e in our_capture.events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    assert our_capture.trace.runtime["correlation"].is_unique
    assert set(our_capture.trace.runtime["correlation"]) == launches


def test_microseconds_convert_to_exact_nanoseconds() -> None:
    # 5112825914365.483 us is not representable in float64 to the ns; the text is.
    assert us_to_ns("5112825914365.483") == 5112825914365483
    assert us_to_ns(1694039994139246) == 1694039994139246000
    assert us_to_ns("0.0005") == 0 and us_to_ns("0.0015") == 2  # half-even below 1 ns
    assert us_to_ns("1.5e3") == 1_500_000
    assert us_to_ns(None) is None and us_to_ns("x") is None


def test_flows_supply_missing_correlation_and_gpu_annotations_are_the_fallback() -> None:
    """An older-style trace: kernels without args.correlation, linked only by ac2g flows; one
    kernel whose launch is unknown falls back to the GPU-side annotation on its stream."""
    doc = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "forward.decode", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
         "args": {"correlation": 7}},
        {"ph": "s", "cat": "ac2g", "id": 7, "pid": 1, "tid": 1, "ts": 20},
        {"ph": "f", "cat": "ac2g", "id": 7, "pid": 0, "tid": 3, "ts": 30, "bp": "e"},
        {"ph": "X", "cat": "Kernel", "name": "gemm_kernel", "pid": 0, "tid": 3, "ts": 30, "dur": 4},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "sampling", "pid": 0, "tid": 3, "ts": 200, "dur": 20},
        {"ph": "X", "cat": "kernel", "name": "topk", "pid": 0, "tid": 3, "ts": 205, "dur": 2.5},
    ]}
    k = parse_kineto(doc).kernels.set_index("name")
    assert k.loc["gemm_kernel", "correlation"] == 7
    assert k.loc["gemm_kernel", "range_path"] == "step/forward.decode"
    assert k.loc["gemm_kernel", "step_id"] == 0 and k.loc["gemm_kernel", "device"] == 0
    assert k.loc["topk", "range_path"] == "sampling" and k.loc["topk", "dur_ns"] == 2500
    assert k.loc["topk", "stream"] == 3 and k.loc["topk", "step_id"] == -1
