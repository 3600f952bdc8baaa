"""A node's dcgm-exporter scrape with several GPUs and pods, built from the real single-GPU L4 scrape
(../shared/fixtures/dcgm_exporter_l4.prom): each family's sample line repeated once per GPU with
that GPU's index, UUID, device and PCI bus id, and dcgm-exporter's Kubernetes labels (pod,
namespace, container) on the GPUs allocated to a pod, as its pod-resources mapping adds them; plus
an independent reader of such text (a regex per line) for the tests' expected values."""
from __future__ import annotations

import re
from dataclasses import dataclass

L4_UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"  # the fixture's one GPU


@dataclass(frozen=True)
class NodeGpu:
    index: int
    uuid: str
    pod: str = ""        # "" : not allocated to a pod (no Kubernetes labels on its series)
    namespace: str = ""
    container: str = ""


def node_scrape(l4_text: str, gpus: list[NodeGpu], energy_mj: dict[str, int] | None = None) -> str:
    """The fixture's families, each sample repeated per GPU. energy_mj: a GPU's energy counter value in
    place of the fixture's (a later scrape of the same node)."""
    out: list[str] = []
    for line in l4_text.splitlines():
        if line.startswith("#") or not line.strip():
            out.append(line)
            continue
        for gpu in gpus:
            sample = (line.replace('gpu="0"', f'gpu="{gpu.index}"').replace(L4_UUID, gpu.uuid)
                      .replace('device="nvidia0"', f'device="nvidia{gpu.index}"')
                      .replace('pci_bus_id="00000000:31:00.0"', f'pci_bus_id="00000000:{0x31 + gpu.index:02x}:00.0"'))
            if gpu.pod:
                sample = sample.replace("} ", f',container="{gpu.container}",namespace="{gpu.namespace}",'
                                              f'pod="{gpu.pod}"}} ', 1)
            if energy_mj and gpu.uuid in energy_mj and sample.startswith("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{"):
                sample = re.sub(r"\} \S+$", f"}} {energy_mj[gpu.uuid]}", sample)
            out.append(sample)
    return "\n".join(out) + "\n"


_SAMPLE = re.compile(r"^(DCGM_\w+)\{(.*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def raw_series(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every DCGM sample line, read with regexes only."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m:
            out.append((m.group(1), dict(_LABEL.findall(m.group(2))), float(m.group(3))))
    return out
