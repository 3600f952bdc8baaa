"""Which rank hosts which experts of one MoE layer: contiguous home shards plus optional replicas.

Rank r's home experts are [floor(r*E/W), floor((r+1)*E/W)), i.e. [r*E/W, (r+1)*E/W) when W divides E.
A replica is an extra copy of an expert on another rank (an EPLB-style plan, see
infersight.correlate.expert_parallel.plan_replication); tokens routed to a replicated expert are
split round-robin over its copies. Each rank numbers its hosted experts in *local slots*: home
experts first, in ascending id, then its replicas in the order they were added.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch


def home_bounds(n_experts: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of the experts that rank `rank` owns without replication."""
    return rank * n_experts // world, (rank + 1) * n_experts // world


@dataclass(frozen=True)
class RouteTables:
    """Device tables for dispatch: for expert e, its copies j < n_replicas[e] live on rank
    replica_rank[e, j] at local slot replica_slot[e, j] (copies sorted by rank; padding -1)."""

    n_replicas: torch.Tensor    # [E] int64
    replica_rank: torch.Tensor  # [E, max copies] int64
    replica_slot: torch.Tensor  # [E, max copies] int64
    max_slots: int              # the most local slots any rank has (the width of the counts exchange)


@dataclass(frozen=True)
class LayerPlacement:
    """slots[r]: the global expert id of each local slot of rank r."""

    n_experts: int
    slots: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        hosted: set[int] = set()
        for rank, experts in enumerate(self.slots):
            if len(set(experts)) != len(experts):
                raise ValueError(f"rank {rank} hosts an expert twice: {experts}")
            if any(not 0 <= e < self.n_experts for e in experts):
                raise ValueError(f"rank {rank} hosts an expert outside [0, {self.n_experts}): {experts}")
            hosted.update(experts)
        if len(hosted) != self.n_experts:
            missing = sorted(set(range(self.n_experts)) - hosted)
            raise ValueError(f"experts {missing} are hosted by no rank")

    @classmethod
    def contiguous(cls, n_experts: int, world: int) -> "LayerPlacement":
        """The home placement: no replicas."""
        if world < 1 or n_experts < world:
            raise ValueError(f"expert parallelism needs 1 <= world <= n_experts, got world {world}, "
                             f"{n_experts} experts")
        return cls(n_experts, tuple(tuple(range(*home_bounds(n_experts, world, r))) for r in range(world)))

    def with_replicas(self, added: Iterable[tuple[int, int]]) -> "LayerPlacement":
        """This placement plus a replica of `expert` on `rank` for each (expert, rank), in order."""
        slots = [list(s) for s in self.slots]
        for expert, rank in added:
            if not 0 <= rank < len(slots):
                raise ValueError(f"replica of expert {expert} on rank {rank}: no such rank (world {len(slots)})")
            slots[rank].append(int(expert))
        return LayerPlacement(self.n_experts, tuple(tuple(s) for s in slots))

    @property
    def world(self) -> int:
        return len(self.slots)

    @property
    def replicated(self) -> bool:
        return sum(len(s) for s in self.slots) > self.n_experts

    def tables(self, device: torch.device | str) -> RouteTables:
        copies: list[list[tuple[int, int]]] = [[] for _ in range(self.n_experts)]
        for rank, experts in enumerate(self.slots):
            for slot, expert in enumerate(experts):
                copies[expert].append((rank, slot))  # ranks visited in order: copies sorted by rank
        width = max(len(c) for c in copies)
        ranks = [[r for r, _ in c] + [-1] * (width - len(c)) for c in copies]
        slots = [[s for _, s in c] + [-1] * (width - len(c)) for c in copies]

        def tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return RouteTables(tensor([len(c) for c in copies]), tensor(ranks), tensor(slots),
                           max(len(s) for s in self.slots))
