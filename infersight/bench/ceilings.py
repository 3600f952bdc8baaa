"""`infersight bench ceilings`: the roofline's two peaks, measured on this machine, and cached.

- copy bandwidth: bytes read + written per second of a device-to-device copy (`dst.copy_(src)`)
  of copy_mib MiB, far larger than any cache;
- dense GEMM throughput: 2 n^3 FLOPs per second of an n x n x n matmul at the dtype (out= a
  preallocated tensor, so no allocation is timed).

Each is run `warmup` times untimed (kernel selection, clocks ramping up), then timed `repeats`
times one by one: on CUDA by a pair of CUDA events around each run (device time, read after one
synchronize at the end), on the CPU by time.perf_counter around each. The median is kept, with the
fastest and slowest run. The result goes into the ceilings cache (kernels.ceilings.ceiling_cache), keyed by
device name, dtype and torch version, where every roofline (analyze, bench runtime, the agent's
captures and windows) finds it and names it "measured", with this host and time.

What it is not: the datasheet's peak (kernels.ceilings.device_ceilings.DATASHEETS), nor what a kernel of another
shape reaches (a small or skinny matmul runs below it).
"""
from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from infersight.kernels.ceilings.ceiling_cache import CeilingMeasurement, host_cpu_name, write_cache

#: dtypes `bench ceilings` measures (fp8 needs scaled matmuls: not a plain torch.matmul).
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: Defaults per backend: (copy MiB, GEMM n, warm-up runs, timed runs). The CUDA copy is 2 GiB
#: (50x an H200's L2), the GEMM 8192^3 (1.1 TFLOP); the CPU ones finish in seconds on 2 cores.
DEFAULTS = {"cuda": (2048, 8192, 5, 20), "cpu": (256, 2048, 1, 5)}


@dataclass
class CeilingsBenchResult:
    """What `bench ceilings` measured (module docstring). device: the name the ceiling is cached
    and looked up under; *_range: the fastest and slowest timed run."""

    device: str
    backend: str
    dtype: str
    torch: str
    host: str
    measured_at: str
    clock: str
    copy_bytes: int
    copy_gbps: float
    copy_gbps_range: tuple[float, float]
    gemm_n: int
    gemm_tflops: float
    gemm_tflops_range: tuple[float, float]
    warmup: int
    repeats: int
    threads: int | None
    cache: str | None          # the cache file written, None when not written
    method: str = ("measured: copy = (read + written bytes) / time of dst.copy_(src); GEMM = 2n^3 / time of "
                   "torch.matmul at dtype; medians")

    def measurement(self) -> CeilingMeasurement:
        return CeilingMeasurement(self.device, self.dtype, self.torch, self.host, self.measured_at, self.clock,
                                  self.copy_gbps, self.copy_bytes, self.gemm_tflops, self.gemm_n, self.repeats,
                                  self.threads)


def resolve_device(device: str) -> str:
    """auto -> cuda when available, else cpu; cuda and cuda:N must be available."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device here (torch {torch.__version__})")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    return device


def timed_seconds(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of `repeats` runs of fn after `warmup` untimed ones: CUDA events on CUDA,
    perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    if not device.startswith("cuda"):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times
    torch.cuda.synchronize(device)
    stream = torch.cuda.current_stream(device)
    pairs = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        fn()
        end.record(stream)
        pairs.append((begin, end))
    torch.cuda.synchronize(device)
    return [b.elapsed_time(e) / 1e3 for b, e in pairs]


def measure_copy_gbps(device: str, dtype: torch.dtype, nbytes: int, warmup: int, repeats: int) -> list[float]:
    """GB/s (read + written bytes, 2 * nbytes) of each timed dst.copy_(src) of nbytes."""
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    src = torch.ones(n, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    seconds = timed_seconds(lambda: dst.copy_(src), device, warmup, repeats)
    moved = 2 * n * src.element_size()
    del src, dst
    return [moved / s / 1e9 for s in seconds]


def measure_gemm_tflops(device: str, dtype: torch.dtype, n: int, warmup: int, repeats: int) -> list[float]:
    """TFLOP/s (2 n^3 FLOPs) of each timed n x n x n torch.matmul into a preallocated output."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    c = torch.empty(n, n, dtype=dtype, device=device)
    seconds = timed_seconds(lambda: torch.matmul(a, b, out=c), device, warmup, repeats)
    del a, b, c
    return [2.0 * n ** 3 / s / 1e12 for s in seconds]


def bench_ceilings(device: str = "auto", dtype: str | None = None, copy_mib: int | None = None,
                   gemm_n: int | None = None, warmup: int | None = None, repeats: int | None = None,
                   cache: Path | None = None, write: bool = True) -> CeilingsBenchResult:
    """Measure both ceilings (module docstring) and, unless write is False, cache them (cache: the
    file; default kernels.ceilings.ceiling_cache.default_cache_path()). dtype default: bfloat16 on CUDA,
    float32 on the CPU. Sizes and counts default to DEFAULTS of the backend."""
    device = resolve_device(device)
    backend = "cuda" if device.startswith("cuda") else "cpu"
    dtype = dtype or ("bfloat16" if backend == "cuda" else "float32")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    d_mib, d_n, d_warm, d_rep = DEFAULTS[backend]
    copy_mib, gemm_n = copy_mib or d_mib, gemm_n or d_n
    warmup = d_warm if warmup is None else warmup
    repeats = repeats or d_rep
    if copy_mib < 1 or gemm_n < 16 or warmup < 0 or repeats < 1:
        raise ValueError("copy MiB must be >= 1, GEMM n >= 16, warm-up runs >= 0 and timed runs >= 1")
    copies = measure_copy_gbps(device, DTYPES[dtype], copy_mib << 20, warmup, repeats)
    gemms = measure_gemm_tflops(device, DTYPES[dtype], gemm_n, warmup, repeats)
    if backend == "cuda":
        torch.cuda.empty_cache()
    result = CeilingsBenchResult(
        device=torch.cuda.get_device_name(device) if backend == "cuda" else host_cpu_name(),
        backend=backend, dtype=dtype, torch=torch.__version__, host=platform.node() or "unknown host",
        measured_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        clock="CUDA events" if backend == "cuda" else "perf_counter",
        copy_bytes=copy_mib << 20, copy_gbps=round(statistics.median(copies), 1),
        copy_gbps_range=(round(min(copies), 1), round(max(copies), 1)),
        gemm_n=gemm_n, gemm_tflops=_sig(statistics.median(gemms)),
        gemm_tflops_range=(_sig(min(gemms)), _sig(max(gemms))),
        warmup=warmup, repeats=repeats, threads=torch.get_num_threads() if backend == "cpu" else None, cache=None)
    if write:
        result.cache = str(write_cache(result.measurement(), cache))
    return result


def as_dict(result: CeilingsBenchResult) -> dict[str, object]:
    return asdict(result)


def _sig(x: float) -> float:
    """x to 4 significant digits (a CPU's TFLOP/s would round to 0 at fixed decimals)."""
    return float(f"{x:.4g}")
