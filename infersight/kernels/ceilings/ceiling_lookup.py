"""Which ceilings a roofline uses: for each of the two peaks, the first of
1. given: the user's number (--peak-tflops / --peak-gbps and the like);
2. measured: this device's entry in the ceilings cache (kernels.ceilings.ceiling_cache; for the compute peak
   at the same dtype; the copy bandwidth of any dtype will do), the one measured with the installed
   torch, else the newest;
3. datasheet: the device's published figure (kernels.ceilings.device_ceilings.DATASHEETS);
and no ceiling at all when one of the peaks has none of these: the lookup then says which is
missing and how to get it, and the roofline shows achieved rates only. Nothing is invented.

Torch-free.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersight.kernels.ceilings.ceiling_cache import best_measurement, default_cache_path, read_cache, torch_version
from infersight.kernels.ceilings.device_ceilings import CeilingSource, DeviceCeilings, datasheet_for, rate_text

#: How the CLI's `analyze` names the flags a given ceiling came from.
ANALYZE_FLAGS = ("--peak-tflops", "--peak-gbps")


@dataclass(frozen=True)
class CeilingLookup:
    """The outcome of a lookup: the ceilings (None when none is known) and, then, why not."""

    device: str
    dtype: str
    ceilings: DeviceCeilings | None
    missing: str = ""

    def as_dict(self) -> dict[str, Any]:
        """DeviceCeilings.as_dict() plus dtype; or {name, dtype, known: False, note}."""
        if self.ceilings is None:
            return {"name": self.device, "dtype": self.dtype, "known": False, "note": self.missing}
        return {**self.ceilings.as_dict(), "dtype": self.dtype}

    def describe(self) -> str:
        """One line for people: the ceilings and their sources, or why there are none."""
        return self.ceilings.describe() if self.ceilings is not None else self.missing

    def bandwidth_said(self) -> str:
        """"4,800 GB/s, datasheet: ..." (the memory peak and its source), or why there is none."""
        c = self.ceilings
        return (f"{rate_text(c.peak_gbps)} GB/s on {c.name}, {c.gbps_source.label()}" if c and c.gbps_source
                else self.missing)

    def compute_said(self) -> str:
        """"989 TFLOP/s, datasheet: ..." (the compute peak and its source), or why there is none."""
        c = self.ceilings
        return (f"{rate_text(c.peak_tflops)} TFLOP/s on {c.name}, {c.tflops_source.label()}" if c and c.tflops_source
                else self.missing)


def _peak(given: float | None, given_as: str, measured: float | None, measured_detail: str,
          datasheet: float | None, datasheet_detail: str) -> tuple[float, CeilingSource] | None:
    if given is not None:
        return given, CeilingSource("given", given_as)
    if measured is not None:
        return measured, CeilingSource("measured", measured_detail)
    if datasheet is not None:
        return datasheet, CeilingSource("datasheet", datasheet_detail)
    return None


def lookup_ceilings(device: str | None, dtype: str, peak_tflops: float | None = None, peak_gbps: float | None = None,
                    cache: Path | None = None, given_as: tuple[str, str] | None = ANALYZE_FLAGS) -> CeilingLookup:
    """The ceilings of `device` at `dtype` (module docstring). given_as: how to name a given peak
    (the flags it came from; None: the caller has no such flags, and the note offers none)."""
    flags = given_as or ("given by the caller", "given by the caller")
    name = device or "an unnamed device"
    entries = read_cache(cache) if device else []
    torch = torch_version()
    gemm = best_measurement(entries, name, dtype, torch)
    copy = best_measurement(entries, name, dtype, torch) or best_measurement(entries, name, None, torch)
    sheet = datasheet_for(device)
    tflops = _peak(peak_tflops, flags[0],
                   gemm.gemm_tflops if gemm else None,
                   f"dense {dtype} matmul {gemm.gemm_n}x{gemm.gemm_n}x{gemm.gemm_n}, {gemm.where()}" if gemm else "",
                   sheet.tflops_for(dtype) if sheet else None,
                   f"{sheet.document}: {sheet.tflops[dtype][1]}" if sheet and dtype in sheet.tflops else "")
    gbps = _peak(peak_gbps, flags[1],
                 copy.copy_gbps if copy else None,
                 f"device-to-device copy of {copy.copy_bytes / 2**20:,.0f} MiB, bytes read + written, {copy.where()}"
                 if copy else "",
                 sheet.gbps[0] if sheet else None, f"{sheet.document}: {sheet.gbps[1]}" if sheet else "")
    if tflops is None or gbps is None:
        what = " or ".join(w for w, v in (("compute", tflops), ("memory-bandwidth", gbps)) if v is None)
        where = cache or default_cache_path()
        give = f", or give the peaks ({' / '.join(given_as)})" if given_as else ""
        note = (f"no {what} ceiling known for {name} ({dtype}): no measurement in {where} and no datasheet entry; "
                f"run `infersight bench ceilings` on that machine{give}; no share of a roof is computed")
        return CeilingLookup(name, dtype, None, note)
    return CeilingLookup(name, dtype, DeviceCeilings(name, tflops[0], gbps[0], tflops[1], gbps[1]))


@dataclass(frozen=True)
class CeilingQuery:
    """What a caller knows before it has read a capture: a device name that overrides the capture's,
    a dtype that overrides the capture's, peaks given by hand, the cache to read. The defaults look
    everything up from the capture itself."""

    device: str | None = None
    dtype: str | None = None
    peak_tflops: float | None = None
    peak_gbps: float | None = None
    cache: Path | None = None
    given_as: tuple[str, str] = ANALYZE_FLAGS

    def lookup(self, devices_seen: Sequence[str], dtype: str) -> CeilingLookup:
        """The lookup for a capture whose devices are `devices_seen` (the first is used) and whose
        elements are `dtype` (both overridden by the query's own)."""
        device = self.device or next(iter(devices_seen), None)
        return lookup_ceilings(device, self.dtype or dtype, self.peak_tflops, self.peak_gbps, self.cache,
                               self.given_as)
