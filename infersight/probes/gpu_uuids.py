"""The GPUs an engine process uses, by UUID, for its GPU records (records.RecordKind.GPU).

A sidecar in a Kubernetes pod sees none of the engine's GPUs (the device plugin gives them to the
engine's container only), so it reads the node's dcgm-exporter and keeps the series of the UUIDs
the engine reports. The UUIDs are the ones NVML and dcgm-exporter print ("GPU-" + 36 characters).

Which GPUs: those CUDA_VISIBLE_DEVICES names, in its order (indices into NVML's list, or UUIDs
given as they are); all of NVML's when it is unset (a pod's container sees its own GPUs only). NVML
is asked, not CUDA: a process that has not touched CUDA yet (vLLM's API server) gets no CUDA
context from this. With CUDA_DEVICE_ORDER other than PCI_BUS_ID an index may name a different GPU
for CUDA than for NVML (vLLM sets PCI_BUS_ID). No NVML, or no GPU: none.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

log = logging.getLogger("infersight.probes")
_UUID_PREFIXES = ("GPU-", "MIG-")


def _nvml_uuids(nvml: Any) -> list[str]:
    nvml.nvmlInit()
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            out.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        return out
    finally:
        nvml.nvmlShutdown()


def visible_gpu_uuids(environ: Mapping[str, str] | None = None, nvml: Any | None = None) -> tuple[str, ...]:
    """The UUIDs of the GPUs this process may use (see the module docstring); () when none. nvml: the
    pynvml module (injectable for tests; None: imported here, when installed)."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible is not None else None
    if entries is not None and entries and all(e.startswith(_UUID_PREFIXES) for e in entries):
        return tuple(entries)  # already UUIDs: nothing to ask
    if entries == []:
        return ()  # CUDA_VISIBLE_DEVICES="" hides every GPU
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        known = _nvml_uuids(nvml)
    except Exception as exc:  # noqa: BLE001 -- ImportError, NVMLError (no driver): no GPU to report
        log.debug("no GPU UUIDs from NVML: %s", exc)
        return ()
    if entries is None:
        return tuple(known)
    out: list[str] = []
    for e in entries:  # CUDA reads the list up to its first entry that names no device
        if e.isdigit() and int(e) < len(known):
            out.append(known[int(e)])
        elif e.startswith(_UUID_PREFIXES):
            out.append(e)
        else:
            break
    return tuple(out)
