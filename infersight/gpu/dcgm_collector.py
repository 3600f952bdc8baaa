"""Collector over DCGM's Python bindings, talking to a running host engine (nv-hostengine).

Written against the bindings DCGM ships (`pydcgm`, `dcgm_structs`, `dcgm_fields`; testing/python3
in NVIDIA/DCGM): connect with `pydcgm.DcgmHandle(ipAddress=...)`, list GPUs with
`system.discovery.GetAllSupportedGpuIds()`, watch a `pydcgm.DcgmFieldGroup` on the default group
(`group.samples.WatchFields(fieldGroup, updateFreq_us, maxKeepAge_s, maxKeepSamples)`), and read
`group.samples.GetLatest_v2(fieldGroup).values[entityGroupId][entityId][fieldId][-1]`, whose
`.value` / `.isBlank` come from the bindings' DcgmFieldValue. The bindings are not on PyPI; DCGM
installs them under /usr/share/datacenter-gpu-manager-4/bindings/python3 (add it to PYTHONPATH).

The field ids watched and their scale to base units are the legacy ones in `dcgm_mapping`
(155 W, 203 %, 252 MiB, 1001-1005 ratios, 1009-1012 bytes/s, ...); `dcgm_values_to_samples`
is the pure mapping step, unit-tested with a fake module.
"""
from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from infersight.gpu.dcgm_blanks import is_blank
from infersight.gpu.dcgm_mapping import BY_FIELD_ID, WATCHED_FIELD_IDS
from infersight.gpu.samples import GpuSample

BINDINGS_HINT = "add /usr/share/datacenter-gpu-manager-4/bindings/python3 to PYTHONPATH"


@dataclass(frozen=True)
class DcgmBindings:
    """The three binding modules, passed around together (tests pass fakes)."""

    pydcgm: Any
    dcgm_structs: Any
    dcgm_fields: Any
    dcgm_agent: Any = None  # dcgmProfPause / dcgmProfResume; absent in stripped-down installs


def import_bindings() -> DcgmBindings:
    """Import DCGM's bindings lazily; raises ImportError (with the fix) when they are missing."""
    try:
        modules = [importlib.import_module(m) for m in ("pydcgm", "dcgm_structs", "dcgm_fields")]
    except ImportError as e:
        raise ImportError(f"DCGM Python bindings not importable ({e}); {BINDINGS_HINT}") from e
    try:
        agent = importlib.import_module("dcgm_agent")
    except ImportError:
        agent = None
    return DcgmBindings(*modules, agent)


def dcgm_values_to_samples(values: Mapping[int, Mapping[int, Mapping[int, Any]]], gpu_entity_group: int,
                           uuids: Mapping[int, str], ts_ns: int) -> list[GpuSample]:
    """`values[entityGroupId][gpuId][fieldId]` is a time series (latest last) of values with
    `.value` and `.isBlank`. Keeps GPU entities only, drops blanks (the bindings' flag, and our own
    sentinel check for a binding that forgot to set it), scales to base units."""
    out: list[GpuSample] = []
    for gpu_id, by_field in sorted(values.get(gpu_entity_group, {}).items()):
        for field_id, series in sorted(by_field.items()):
            mapped = BY_FIELD_ID.get(int(field_id))
            if mapped is None or len(series) == 0:
                continue
            latest = series[-1]
            if getattr(latest, "isBlank", False) or latest.value is None:
                continue
            raw = float(latest.value)
            if is_blank(raw):
                continue
            out.append(GpuSample(int(gpu_id), uuids.get(int(gpu_id), ""), mapped.field, raw * mapped.scale, ts_ns))
    return out


class DcgmCollector:
    """Watches the mapped fields on every supported GPU; each poll reads the latest values.

    update_interval_s is how often the host engine samples; keep it at or below the poll interval."""

    name = "dcgm"

    def __init__(self, host: str = "127.0.0.1", update_interval_s: float = 1.0, bindings: DcgmBindings | None = None,
                 connect_timeout_ms: int = 1000, clock: Callable[[], int] = time.monotonic_ns) -> None:
        b = bindings or import_bindings()
        self._b = b
        self._clock = clock
        self._closed = False
        self.host = host
        # Fails fast (DCGMError) when no host engine answers at `host`.
        self._handle = b.pydcgm.DcgmHandle(ipAddress=host, opMode=b.dcgm_structs.DCGM_OPERATION_MODE_AUTO,
                                           timeoutMs=connect_timeout_ms)
        try:
            system = self._handle.GetSystem()
            self._gpu_ids = list(system.discovery.GetAllSupportedGpuIds())
            ids = {g: system.discovery.GetGpuAttributes(g).identifiers for g in self._gpu_ids}
            self._uuids = {g: _text(i.uuid) for g, i in ids.items()}
            self._names = {g: _text(i.deviceName) for g, i in ids.items()}
            self._group = system.GetDefaultGroup()
            # The field-group name must be unique per host engine; several sidecars may share one.
            self._fields = b.pydcgm.DcgmFieldGroup(self._handle, name=f"infersight-{os.getpid()}",
                                                   fieldIds=list(WATCHED_FIELD_IDS))
            update_us = max(int(update_interval_s * 1e6), 100_000)
            self._group.samples.WatchFields(self._fields, update_us, 60.0, 0)
            system.UpdateAllFields(True)  # first values now, not after one update period
        except BaseException:
            self._handle.Shutdown()
            raise

    def poll(self) -> list[GpuSample]:
        latest = self._group.samples.GetLatest_v2(self._fields)
        return dcgm_values_to_samples(latest.values, self._b.dcgm_fields.DCGM_FE_GPU, self._uuids, self._clock())

    def set_profiling_paused(self, paused: bool) -> None:
        """dcgmProfPause / dcgmProfResume on the host engine (what `dcgmi profile --pause` does):
        DCGM then stores blanks for its profiling fields while Nsight tools own the counters."""
        agent = self._b.dcgm_agent
        if agent is None:
            raise RuntimeError("dcgm_agent is not importable, so DCGM profiling cannot be paused from here")
        (agent.dcgmProfPause if paused else agent.dcgmProfResume)(self._handle.handle)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._group.samples.UnwatchFields(self._fields)
            self._fields.Delete()
        finally:
            self._handle.Shutdown()

    def status_line(self) -> str:
        names = ", ".join(sorted(set(self._names.values()))) or "no GPUs"
        return f"GPU telemetry: dcgm host engine at {self.host}, {len(self._gpu_ids)} GPU(s) ({names})"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
