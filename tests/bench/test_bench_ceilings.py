"""`infersight bench ceilings` on the CPU: it measures, caches what it measured, and agrees with an
independent measurement (numpy, timed here) within a generous factor: this host is shared and
loaded, and numpy's copy (glibc memcpy, streaming stores) moves fewer bytes per byte copied than
torch's copy kernel, so only the order of magnitude is checked."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from infersight.bench.ceilings import bench_ceilings
from infersight.cli import main
from infersight.kernels.ceilings.ceiling_cache import read_cache
from infersight.kernels.ceilings.ceiling_lookup import lookup_ceilings

COPY_MIB = 128  # past the last-level cache of the hosts we run on
GEMM_N = 512


def _numpy_copy_gbps(nbytes: int, repeats: int = 5) -> float:
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages first
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times) / 1e9


def _numpy_gemm_tflops(n: int, repeats: int = 5) -> float:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    c = a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def test_cpu_ceilings_are_measured_cached_and_agree_with_numpy(tmp_path: Path) -> None:
    cache = tmp_path / "ceilings.json"
    result = bench_ceilings(device="cpu", copy_mib=COPY_MIB, gemm_n=GEMM_N, repeats=5, cache=cache)
    assert (result.backend, result.dtype, result.clock, result.cache) == ("cpu", "float32", "perf_counter", str(cache))
    low, high = result.copy_gbps_range
    assert result.copy_bytes == COPY_MIB << 20 and low <= result.copy_gbps <= high
    # The cache holds what was measured, and a roofline on this CPU reads it back as measured.
    (entry,) = read_cache(cache)
    assert (entry.device, entry.copy_gbps, entry.gemm_tflops, entry.host) == \
        (result.device, result.copy_gbps, result.gemm_tflops, result.host)
    c = lookup_ceilings(result.device, "float32", cache=cache).ceilings
    assert c is not None and (c.peak_gbps, c.peak_tflops) == (result.copy_gbps, result.gemm_tflops)
    assert c.gbps_source.kind == c.tflops_source.kind == "measured" and result.measured_at in c.gbps_source.detail
    # Independently: numpy's copy of the same bytes and its matmul of the same shape, timed here.
    copy_ratio = result.copy_gbps / _numpy_copy_gbps(COPY_MIB << 20)
    gemm_ratio = result.gemm_tflops / _numpy_gemm_tflops(GEMM_N)
    assert 1 / 5 < copy_ratio < 5, copy_ratio
    assert 1 / 10 < gemm_ratio < 10, gemm_ratio


def test_the_command_prints_json_and_writes_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    cache = tmp_path / "ceilings.json"
    small = ["bench", "ceilings", "--device", "cpu", "--copy-mib", "8", "--gemm-n", "64", "--repeats", "2",
             "--cache", str(cache), "--json"]
    assert main([*small, "--no-cache"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cache"] is None and not cache.exists() and printed["copy_gbps"] > 0
    assert main([*small, "--dtype", "bfloat16"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["dtype"] == "bfloat16" and [(e.dtype, e.copy_gbps) for e in read_cache(cache)] == \
        [("bfloat16", printed["copy_gbps"])]


def test_a_device_that_is_not_here_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["bench", "ceilings", "--device", "cuda", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
