"""The expert-parallel process group: who this rank is, and how to join the world.

NCCL on CUDA devices, gloo on CPU. Under torchrun the world comes from the environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); tests/parallel/gloo_spawn.py builds the same environment for local
CPU runs (tests). NVLink multicast (NVLS) stays off: see NVLS_OFF_ENV.
"""
from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

#: Set before the first NCCL communicator exists, in every rank: keeps NCCL, torch symmetric
#: memory and NVSHMEM off NVLink SHARP multicast, which the lent multi-GPU hosts must not use.
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

#: A collective that waits longer than this raises instead of hanging the engine forever.
DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)


@dataclass(frozen=True)
class EPGroup:
    """This rank's place in the expert-parallel world. group None: the default (WORLD) group."""

    rank: int
    world: int
    device: str
    group: dist.ProcessGroup | None = None

    @property
    def backend(self) -> str:
        return dist.get_backend(self.group)


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (the rendezvous of local runs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def init_from_env(device: str = "auto", timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> EPGroup:
    """Join the world described by torchrun's environment; device "auto" means cuda:LOCAL_RANK
    when CUDA is available, else cpu. Returns the group (the default process group)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{local_rank}"
    if device.startswith("cuda"):
        for key, value in NVLS_OFF_ENV.items():
            os.environ[key] = value  # before init_process_group: NCCL reads these at communicator creation
        torch.cuda.set_device(torch.device(device))
    if not dist.is_initialized():
        kwargs = {"device_id": torch.device(device)} if device.startswith("cuda") else {}
        dist.init_process_group(backend_for(device), rank=rank, world_size=world, timeout=timeout, **kwargs)
    return EPGroup(rank, world, device)
