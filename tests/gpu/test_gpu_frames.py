"""samples_frame / step_averages / phase_breakdown on eight-row frames with hand-computed results."""
from __future__ import annotations

import pandas as pd
import pytest

from infersight.gpu.frames import phase_breakdown, samples_frame, step_averages
from infersight.gpu.samples import GpuSample

T, D, P = "tensor_active_ratio", "dram_active_ratio", "power_watts"
SAMPLES = [
    GpuSample(0, "GPU-a", T, 0.2, 100), GpuSample(0, "GPU-a", D, 0.6, 100),
    GpuSample(0, "GPU-a", T, 0.4, 150), GpuSample(0, "GPU-a", D, 0.5, 150),
    GpuSample(0, "GPU-a", T, 0.9, 200), GpuSample(0, "GPU-a", D, 0.1, 200),   # on the step 1 / step 2 boundary
    GpuSample(0, "GPU-a", T, 0.7, 250), GpuSample(0, "GPU-a", D, 0.3, 250),
    GpuSample(0, "GPU-a", T, 0.0, 400),                                       # after every step
    GpuSample(1, "GPU-b", T, 0.1, 150),
    GpuSample(0, "GPU-a", P, 300.0, 150),
    GpuSample(0, "GPU-a", T, 0.99, 150, instance="3"),                       # a MIG instance: excluded
]
#              step 1 [100, 200]: prefill-heavy (512 > 0)
#              step 2 [200, 300]: decode-heavy (4 == 4 is not prefill-heavy)
#              step 3 [310, 390]: no samples
STEPS = pd.DataFrame({"step_id": [1, 2, 3], "start_ns": [100, 200, 310], "end_ns": [200, 300, 390],
                      "prefill_tokens": [512, 4, 0], "decode_tokens": [0, 4, 16]})


def test_samples_frame_columns_and_dtypes() -> None:
    df = samples_frame(SAMPLES)
    assert list(df.columns) == ["ts_ns", "gpu", "uuid", "field", "value", "instance"]
    assert [str(t) for t in df.dtypes] == ["int64", "int64", "object", "object", "float64", "object"]
    assert len(df) == 12 and df.iloc[-1].to_dict() == {"ts_ns": 150, "gpu": 0, "uuid": "GPU-a", "field": T,
                                                        "value": 0.99, "instance": "3"}
    empty = samples_frame([])
    assert empty.empty and list(empty.columns) == list(df.columns)


def test_step_averages() -> None:
    df = samples_frame(SAMPLES)
    before = df.copy()
    out = step_averages(df, STEPS)
    assert list(out.columns) == ["step_id", "gpu", "field", "mean"]
    rows = [tuple(r) for r in out.itertuples(index=False)]
    # step 1, gpu 0: tensor (0.2 + 0.4 + 0.9) / 3 = 0.5, dram (0.6 + 0.5 + 0.1) / 3 = 0.4, power 300
    # step 1, gpu 1: tensor 0.1
    # step 2, gpu 0: tensor (0.9 + 0.7) / 2 = 0.8, dram (0.1 + 0.3) / 2 = 0.2
    expected = [(1, 0, D, 0.4), (1, 0, P, 300.0), (1, 0, T, 0.5), (1, 1, T, 0.1), (2, 0, D, 0.2), (2, 0, T, 0.8)]
    assert [r[:3] for r in rows] == [e[:3] for e in expected]
    assert [r[3] for r in rows] == pytest.approx([e[3] for e in expected])
    pd.testing.assert_frame_equal(df, before)  # input untouched


def test_phase_breakdown() -> None:
    out = phase_breakdown(samples_frame(SAMPLES), STEPS)
    assert list(out.columns) == ["phase", "field", "mean"]
    rows = [tuple(r) for r in out.itertuples(index=False)]
    # prefill-heavy = step 1 samples of both GPUs: tensor (0.2 + 0.4 + 0.9 + 0.1) / 4 = 0.4; dram 0.4
    # decode-heavy = step 2: tensor (0.9 + 0.7) / 2 = 0.8; dram (0.1 + 0.3) / 2 = 0.2. Power is not asked for.
    assert [r[:2] for r in rows] == [("prefill_heavy", T), ("prefill_heavy", D), ("decode_heavy", T),
                                     ("decode_heavy", D)]
    assert [r[2] for r in rows] == pytest.approx([0.4, 0.4, 0.8, 0.2])


def test_no_overlap_and_empty_inputs() -> None:
    df = samples_frame(SAMPLES)
    late = pd.DataFrame({"step_id": [9], "start_ns": [1000], "end_ns": [2000], "prefill_tokens": [1],
                         "decode_tokens": [0]})
    for f in (step_averages, phase_breakdown):
        assert f(df, late).empty
        assert f(samples_frame([]), STEPS).empty
        assert f(df, STEPS.iloc[0:0]).empty
    assert list(step_averages(df, late).columns) == ["step_id", "gpu", "field", "mean"]
    # A frame built elsewhere without the instance column is treated as whole-GPU rows.
    no_instance = df[df["instance"] == ""].drop(columns="instance")
    assert step_averages(no_instance, STEPS).equals(step_averages(df, STEPS))
