"""GpuReadings on tiny cases: what it takes in (whole GPUs, the engine's, each reading once), how far
every GPU's readings reach, the highest power seen (worked out by hand), and what trim keeps."""
from __future__ import annotations

from infersight.agent.gpu_readings import ENERGY_FIELD, POWER_FIELD, SM_FIELD, GpuReadings
from infersight.gpu.samples import GpuSample

MS = 1_000_000


def _energy(gpu: int, ts_ms: int, joules: float, instance: str = "") -> GpuSample:
    return GpuSample(gpu, f"GPU-{gpu}", ENERGY_FIELD, joules, ts_ms * MS, instance)


def test_takes_each_reading_once_and_only_the_engines_whole_gpus() -> None:
    r = GpuReadings(wanted=(0, 1))
    sm = r.add([_energy(0, 1000, 10.0), _energy(1, 1000, 20.0), _energy(2, 1000, 99.0),  # GPU 2: not the engine's
                _energy(0, 1000, 10.0),  # the same reading again
                _energy(0, 1000, 5.0, instance="1"),  # a MIG instance
                GpuSample(0, "GPU-0", SM_FIELD, 0.5, 1000 * MS)])
    assert r.gpus == (0, 1)
    assert sorted(zip(r.energy["gpu"], r.energy["value"])) == [(0, 10_000_000), (1, 20_000_000)]  # uJ
    assert sm == [(1000 * MS, 0, 0.5)] and r.sm.empty  # SM readings wait for integrate_sm
    assert r.every_gpu_read() and r.covered_ns(ENERGY_FIELD) == 1000 * MS and r.covered_ns(SM_FIELD) == -1


def test_covered_until_the_gpu_read_last_and_the_highest_power() -> None:
    r = GpuReadings()
    r.add([_energy(0, 1000, 10.0), _energy(1, 1000, 20.0)])
    r.add([_energy(0, 2000, 310.0), _energy(1, 1500, 70.0), GpuSample(1, "GPU-1", POWER_FIELD, 450.0, 1500 * MS)])
    assert r.covered_ns(ENERGY_FIELD) == 1500 * MS  # GPU 1 has read only until 1.5 s
    # GPU 0: 300 J over 1 s = 300 W; GPU 1: 50 J over 0.5 s = 100 W, its power gauge 450 W. In uJ per ns: W / 1000.
    assert r.power_hi == {0: 0.3, 1: 0.45}


def test_trim_keeps_each_gpus_last_reading_at_or_before() -> None:
    r = GpuReadings()
    r.add([_energy(0, t, float(t)) for t in (1000, 2000, 3000)] + [_energy(1, t, float(t)) for t in (1500, 3500)])
    r.trim(2500 * MS)
    assert sorted(zip(r.energy["gpu"], r.energy["ts_ns"] // MS)) == [(0, 2000), (0, 3000), (1, 1500), (1, 3500)]
