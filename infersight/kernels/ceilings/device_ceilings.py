"""The ceilings a roofline is placed against, and where each came from.

A roofline share is only as good as its ceiling, so every ceiling carries its source
(CeilingSource), one per value:
- measured: by `infersight bench ceilings` on the machine, read from its cache (kernels.ceilings.ceiling_cache),
  with when, where, which torch and which dtype;
- datasheet: the vendor's published figure for the device (DATASHEETS below, each naming its
  document); a GPU rarely reaches it (BENCHMARKS.md: a device copy reached 4.27 of the 4.8 TB/s
  on our H200, a bf16 GEMM 782 of the 989 TFLOP/s);
- given: a number the user passed (--peak-tflops / --peak-gbps, RecorderConfig.peak_*), or a
  DeviceCeilings built by hand.
For a device with neither a measurement nor a datasheet entry no ceiling is known: the roofline
then shows achieved rates only (kernels.ceilings.ceiling_cache.resolve_ceilings returns None).

Torch-free: the agent and `infersight analyze` read ceilings without torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: The kinds of CeilingSource.
CEILING_KINDS = ("measured", "datasheet", "given")


@dataclass(frozen=True)
class CeilingSource:
    """Where one ceiling value came from. kind: one of CEILING_KINDS; detail: the document, or the
    measurement's where / when / how, or who gave it."""

    kind: str
    detail: str

    def __post_init__(self) -> None:
        if self.kind not in CEILING_KINDS:
            raise ValueError(f"a ceiling's source is one of {', '.join(CEILING_KINDS)}, got {self.kind!r}")

    def label(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


#: A value passed by the caller without a source of its own.
GIVEN = CeilingSource("given", "passed by the user, not measured here")


@dataclass(frozen=True)
class DatasheetEntry:
    """A device's published peaks, each with the datasheet's own words: HBM bandwidth (GB/s, read +
    write) and dense (not 2:4-sparse) matmul TFLOP/s per dtype."""

    device: str                                 # as torch.cuda.get_device_name() and Kineto spell it
    document: str
    gbps: tuple[float, str]                     # (GB/s, as quoted)
    tflops: dict[str, tuple[float, str]]        # dtype name -> (dense TFLOP/s, as quoted)

    def tflops_for(self, dtype: str) -> float | None:
        return self.tflops[dtype][0] if dtype in self.tflops else None


def _hopper() -> dict[str, tuple[float, str]]:
    """H100 and H200 SXM share their compute figures; the tensor-core ones are printed with 2:4 sparsity."""
    halved = "with sparsity, halved for dense"
    return {"bfloat16": (989.0, f"1,979 TFLOPS BF16 {halved}"), "float16": (989.0, f"1,979 TFLOPS FP16 {halved}"),
            "fp8": (1979.0, f"3,958 TFLOPS FP8 {halved}"), "float32": (67.0, "67 TFLOPS FP32")}


#: Published peaks of the GPUs we know, by exact device name (an H200 NVL is not an H200 SXM).
#: float32 is the non-tensor FP32 rate: torch does not use TF32 for float32 matmuls unless told to.
DATASHEETS: tuple[DatasheetEntry, ...] = (
    DatasheetEntry("NVIDIA H200", "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM", (4800.0, "4.8 TB/s HBM3e"),
                   _hopper()),
    DatasheetEntry("NVIDIA H100 80GB HBM3", "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM",
                   (3350.0, "3.35 TB/s HBM3"), _hopper()),
    DatasheetEntry("NVIDIA A100-SXM4-80GB", "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM",
                   (2039.0, "2,039 GB/s HBM2e"),
                   {"bfloat16": (312.0, "312 TFLOPS BF16 dense"), "float16": (312.0, "312 TFLOPS FP16 dense"),
                    "float32": (19.5, "19.5 TFLOPS FP32")}),
)


def datasheet_for(device: str | None) -> DatasheetEntry | None:
    """The datasheet entry of a device, by its exact name."""
    return next((d for d in DATASHEETS if d.device == device), None)


@dataclass(frozen=True)
class DeviceCeilings:
    """Peak throughput to compare against, each value with its source. The defaults are the H200
    SXM datasheet's (dense bf16 matmul, HBM3e bandwidth), labelled datasheet: not what this
    machine reaches; `infersight bench ceilings` measures that, and kernels.ceilings.ceiling_cache.
    resolve_ceilings prefers its measurement. A source left out is filled in when the object is
    built: datasheet when the value is the device's datasheet figure, else given."""

    name: str = "NVIDIA H200"
    peak_tflops: float = 989.0
    peak_gbps: float = 4800.0
    tflops_source: CeilingSource | None = None
    gbps_source: CeilingSource | None = None

    def __post_init__(self) -> None:
        entry = datasheet_for(self.name)
        if self.tflops_source is None:
            quoted = [q for v, q in (entry.tflops.values() if entry else ()) if v == self.peak_tflops]
            found = CeilingSource("datasheet", f"{entry.document}: {quoted[0]}") if entry and quoted else None
            object.__setattr__(self, "tflops_source", found or GIVEN)
        if self.gbps_source is None:
            found = (CeilingSource("datasheet", f"{entry.document}: {entry.gbps[1]}")
                     if entry and entry.gbps[0] == self.peak_gbps else None)
            object.__setattr__(self, "gbps_source", found or GIVEN)

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the memory roof meets the compute roof."""
        return self.peak_tflops * 1e12 / (self.peak_gbps * 1e9)

    def describe(self) -> str:
        """One line for people: the device, each peak and where it came from."""
        assert self.tflops_source is not None and self.gbps_source is not None  # filled by __post_init__
        return (f"{self.name}: {rate_text(self.peak_tflops)} TFLOP/s ({self.tflops_source.label()}), "
                f"{rate_text(self.peak_gbps)} GB/s ({self.gbps_source.label()})")

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: name, peak_tflops, peak_gbps, tflops_source / gbps_source {kind, detail}, known."""
        return {**asdict(self), "known": True}


def rate_text(value: float) -> str:
    """A peak for people: whole numbers with thousands separators, 3 significant digits below 100
    (a CPU's 0.0241 TFLOP/s must not print as 0)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def dtype_name_for_bytes(dtype_bytes: int) -> str:
    """The dtype whose ceiling a capture of `dtype_bytes`-byte elements is compared with (2 bytes:
    bfloat16, the engine's GPU default; float16 has the same datasheet rate)."""
    return {4: "float32", 2: "bfloat16", 1: "fp8"}.get(dtype_bytes, f"{dtype_bytes}-byte")
