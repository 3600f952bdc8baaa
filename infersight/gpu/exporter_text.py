"""Parse a dcgm-exporter `/metrics` body into normalised GpuSamples (both naming schemes).

Parsing goes through prometheus_client's text parser; each sample is keyed on its metric name
(`dcgm_mapping.BY_EXPORTER_NAME`), scaled to base units, and dropped when it is a DCGM blank
sentinel. Series of a MIG GPU instance (label GPU_I_ID) keep that id in `GpuSample.instance` so
they never mix with the whole-GPU series of the same name. Families need not be contiguous (the
exporter docs print whole-GPU then MIG series of the same names), and HELP/TYPE lines are optional.
With a GpuSelection (gpu.selection) only the series of this engine's GPUs are kept: the others are
counted in `not_selected`, by GPU, and go nowhere else (not into samples, gpus, blanks or unmapped).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from infersight.exporters.exposition_parse import metric_families
from infersight.gpu import dcgm_mapping as M
from infersight.gpu.dcgm_blanks import blank_meaning
from infersight.gpu.samples import GpuSample
from infersight.gpu.selection import GpuSelection

DCGM_PREFIXES = ("DCGM_FI_", "DCGM_EXP_")


@dataclass(frozen=True)
class GpuIdentity:
    """What the labels say about one GPU (or MIG instance of it)."""

    gpu: int
    uuid: str
    instance: str = ""
    profile: str = ""
    model: str = ""
    hostname: str = ""
    driver: str = ""
    pci_bus_id: str = ""


@dataclass(frozen=True)
class DroppedBlank:
    """A series whose value was a DCGM sentinel."""

    name: str
    gpu: int
    instance: str
    value: float
    meaning: str


@dataclass
class ParsedExposition:
    """Everything one scrape said. `samples` are ready for the sampler; the rest feeds `analyze`."""

    samples: list[GpuSample] = field(default_factory=list)
    gpus: dict[tuple[int, str, str], GpuIdentity] = field(default_factory=dict)  # (gpu, uuid, instance)
    blanks: list[DroppedBlank] = field(default_factory=list)
    unmapped: set[str] = field(default_factory=set)   # DCGM names we do not map (kept out of samples)
    schemes: set[str] = field(default_factory=set)    # "legacy" and/or "4.9", from the names seen
    hostname_labels: set[str] = field(default_factory=set)  # "Hostname" / "hostname" as spelled
    no_gpu_label: int = 0                              # DCGM series without a usable `gpu` label
    unreadable_values: int = 0                         # DCGM samples whose value no float can hold
    dcgm_series: int = 0
    not_selected: dict[str, int] = field(default_factory=dict)  # UUID -> series left out by the selection


def _identity(labels: Mapping[str, str], gpu: int) -> GpuIdentity:
    return GpuIdentity(gpu=gpu, uuid=M.first_label(labels, M.UUID_LABELS),
                       instance=labels.get(M.MIG_INSTANCE_LABEL, ""),
                       profile=labels.get(M.MIG_PROFILE_LABEL, ""), model=labels.get("modelName", ""),
                       hostname=M.first_label(labels, M.HOSTNAME_LABELS),
                       driver=M.first_label(labels, M.DRIVER_LABELS), pci_bus_id=labels.get("pci_bus_id", ""))


def parse_exposition(text: str, ts_ns: int, selection: GpuSelection | None = None) -> ParsedExposition:
    """Parse `text` (Prometheus text format). Raises ValueError when it is not valid exposition.
    Non-DCGM series are ignored; DCGM series we do not map are listed in `unmapped`; with a
    selection, series of other GPUs are counted in `not_selected` only."""
    out = ParsedExposition()
    for family in metric_families(text):  # raises ValueError lazily, mid-iteration
        for s in family.samples:
            if not s.name.startswith(DCGM_PREFIXES):
                continue
            name = s.name
            # The parser appends "_total" to the samples of a family typed counter (the exporter
            # types energy and replay counts so); the DCGM name is the one without it.
            if family.type == "counter" and name.endswith("_total") and name not in M.BY_EXPORTER_NAME:
                name = name[: -len("_total")]
            out.dcgm_series += 1
            for spelling in ("Hostname", "hostname"):
                if spelling in s.labels:
                    out.hostname_labels.add(spelling)
            try:
                label = s.labels["gpu"]
                if len(label) > 10:  # no GPU index has more digits; int() of 4,300 would be slow or refused
                    raise ValueError(label)
                gpu = int(label)
            except (KeyError, ValueError):
                out.no_gpu_label += 1
                continue
            ident = _identity(s.labels, gpu)
            if selection is not None and not selection.keeps(ident.uuid, s.labels):
                out.not_selected[ident.uuid] = out.not_selected.get(ident.uuid, 0) + 1
                continue
            out.gpus.setdefault((ident.gpu, ident.uuid, ident.instance), ident)
            known = M.BY_EXPORTER_NAME.get(name)
            if known is None:
                out.unmapped.add(name)
                continue
            if known.scheme != "both":
                out.schemes.add(known.scheme)
            try:  # the parser keeps integral text as a Python int: 400 digits do not fit a float
                value = float(s.value)
            except OverflowError:
                out.unreadable_values += 1
                continue
            meaning = blank_meaning(value)
            if meaning is not None:
                out.blanks.append(DroppedBlank(name, gpu, ident.instance, value, meaning))
                continue
            out.samples.append(GpuSample(gpu, ident.uuid, known.field, value * known.scale, ts_ns, ident.instance))
    return out
