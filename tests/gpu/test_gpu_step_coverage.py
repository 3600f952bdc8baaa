"""The GPU reading that covers an engine step, as attached to step spans."""
from __future__ import annotations

import pytest

from infersight.gpu.frames import covering_samples
from infersight.gpu.samples import GpuSample
from infersight.tracing.spans import step_span


def sample(field: str, gpu: int, value: float, ts: int, instance: str = "") -> GpuSample:
    return GpuSample(gpu=gpu, uuid=f"GPU-{gpu}", field=field, value=value, ts_ns=ts, instance=instance)


def test_first_sample_after_the_step_end_per_gpu_averaged_over_gpus():
    samples = [
        sample("tensor_active_ratio", 0, 0.10, 900),    # before the step ends: covers earlier time
        sample("tensor_active_ratio", 0, 0.80, 1_200),  # first after end on GPU 0
        sample("tensor_active_ratio", 0, 0.50, 1_500),  # later on GPU 0: not this step's
        sample("tensor_active_ratio", 1, 0.40, 1_300),  # first after end on GPU 1
        sample("dram_active_ratio", 0, 0.30, 1_100),
        sample("dram_active_ratio", 0, 0.90, 5_000),    # beyond the lag
        sample("sm_active_ratio", 0, 0.99, 1_050, instance="1"),  # a MIG instance: not whole-GPU
    ]
    got = covering_samples(samples, start_ns=500, end_ns=1_000, max_lag_ns=1_000)
    # tensor: (0.80 + 0.40) / 2 = 0.60; dram: 0.30; sm (MIG only): absent
    assert got == {"tensor_active_ratio": pytest.approx(0.6), "dram_active_ratio": 0.3}
    assert covering_samples(samples, 500, 1_000, max_lag_ns=10) == {}


def test_step_span_carries_the_gpu_reading():
    step = {k: 1 for k in ("step_id", "prefill_tokens", "decode_tokens", "spec_tokens", "spec_accepted",
                           "batch_size", "kv_blocks_in_use", "kv_blocks_cached", "kv_blocks_total", "waiting",
                           "running", "swapped", "preempted", "finished")} | {"start_ns": 10, "end_ns": 20}
    span = step_span(step, lambda ns: ns + 1_000, {"tensor_active_ratio": 0.6})
    assert span.attributes["infersight.gpu.tensor_active_ratio"] == 0.6
    assert (span.start_ns, span.end_ns) == (1_010, 1_020)
