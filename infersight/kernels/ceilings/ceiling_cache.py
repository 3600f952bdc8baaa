"""The cache of measured ceilings: a small JSON file `infersight bench ceilings` writes and every
roofline reads (kernels.ceilings.ceiling_lookup).

Where: --cache / the `path` argument, else $INFERSIGHT_CEILINGS, else
${XDG_CACHE_HOME:-~/.cache}/infersight/ceilings.json. One entry per (device, dtype, torch): a new
measurement of the same key replaces the old one. The file:

    {"format": "infersight-ceilings/1",
     "entries": [{"device": "NVIDIA H200", "dtype": "bfloat16", "torch": "2.5.1", "host": "gpu-1",
                  "measured_at": "2026-12-04T10:00:00Z", "clock": "CUDA events",
                  "copy_gbps": 4270.0, "copy_bytes": 2147483648, "gemm_tflops": 782.0, "gemm_n": 8192,
                  "repeats": 20, "threads": null}]}

copy_gbps: bytes read + written per second of a device-to-device copy of copy_bytes; gemm_tflops:
2 n^3 FLOPs per second of an n x n x n matmul at dtype; both the median of `repeats` timed runs.
A file that cannot be read is treated as empty (a roofline then falls back to the datasheet and
says so), never as an error of the analysis reading it.

Torch-free.
"""
from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path

CACHE_FORMAT = "infersight-ceilings/1"
ENV_VAR = "INFERSIGHT_CEILINGS"
#: A cache larger than this is not one we wrote: it is ignored.
MAX_CACHE_BYTES = 1 << 20


@dataclass(frozen=True)
class CeilingMeasurement:
    """One cache entry (module docstring)."""

    device: str
    dtype: str
    torch: str
    host: str
    measured_at: str
    clock: str
    copy_gbps: float
    copy_bytes: int
    gemm_tflops: float
    gemm_n: int
    repeats: int
    threads: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.device, self.dtype, self.torch

    def where(self) -> str:
        """Where, when and how, for a CeilingSource detail."""
        threads = f", {self.threads} threads" if self.threads else ""
        return (f"infersight bench ceilings on {self.host} at {self.measured_at}, torch {self.torch}{threads}, "
                f"median of {self.repeats} by {self.clock}")


def default_cache_path() -> Path:
    """$INFERSIGHT_CEILINGS, else ${XDG_CACHE_HOME:-~/.cache}/infersight/ceilings.json."""
    given = os.environ.get(ENV_VAR, "")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME", "") or str(Path.home() / ".cache")
    return Path(base) / "infersight" / "ceilings.json"


def torch_version() -> str | None:
    """The installed torch's version, read without importing torch; None without torch."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def host_cpu_name() -> str:
    """This host's CPU as a ceiling's device name: "CPU " + /proc/cpuinfo's model name (or what
    platform knows). The engine's CPU windows and `bench ceilings --device cpu` both use it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return "CPU " + " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine() or "unknown")


def _entry(raw: object) -> CeilingMeasurement | None:
    """A well-formed entry, else None (a hand-edited or foreign file must not break a roofline)."""
    if not isinstance(raw, dict):
        return None
    names = {f.name for f in fields(CeilingMeasurement)}
    try:
        m = CeilingMeasurement(**{k: v for k, v in raw.items() if k in names})
    except TypeError:
        return None
    numbers_ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
                     for x in (m.copy_gbps, m.gemm_tflops, m.copy_bytes, m.gemm_n, m.repeats))
    texts_ok = all(isinstance(x, str) and x for x in (m.device, m.dtype, m.torch, m.host, m.measured_at, m.clock))
    return m if numbers_ok and texts_ok else None


def read_cache(path: Path | None = None) -> list[CeilingMeasurement]:
    """The well-formed entries of the cache; [] when it is missing, too large or not ours."""
    p = path or default_cache_path()
    try:
        if not p.is_file() or p.stat().st_size > MAX_CACHE_BYTES:
            return []
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT or not isinstance(doc.get("entries"), list):
        return []
    return [e for e in map(_entry, doc["entries"]) if e is not None]


def write_cache(measurement: CeilingMeasurement, path: Path | None = None) -> Path:
    """Add (or replace, same key) one measurement; written to a temporary file and renamed, so a
    reader never sees half a file. Returns the path written."""
    p = path or default_cache_path()
    kept = [e for e in read_cache(p) if e.key != measurement.key]
    doc = {"format": CACHE_FORMAT, "entries": [asdict(e) for e in kept + [measurement]]}
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return p


def best_measurement(entries: list[CeilingMeasurement], device: str, dtype: str | None,
                     torch: str | None) -> CeilingMeasurement | None:
    """The entry for device (and dtype, unless None: any dtype) measured with this torch, else the
    most recent one (ISO timestamps sort by time)."""
    mine = [e for e in entries if e.device == device and (dtype is None or e.dtype == dtype)]
    same_torch = [e for e in mine if e.torch == torch]
    return max(same_torch or mine, key=lambda e: e.measured_at, default=None)
