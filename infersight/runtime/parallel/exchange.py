"""The token exchange of one expert-parallel MoE layer: where each (token, expert) pair goes, and
the collectives that move rows there and back.

Every rank holds the same tokens (attention is replicated), so each rank *sources* a contiguous
shard of them (shard_sizes) and dispatches only its shard's pairs; after combine, one all-gather
gives every rank the whole layer output again. In a DP-attention deployment each rank would own
different tokens and that all-gather would not exist; it is timed separately (gather_ns).

    dispatch  counts all-to-all  [W, S] pairs per (destination rank, destination slot)
              rows all-to-all    x[token] for every pair, grouped by destination, then slot, then token
    combine   rows all-to-all    expert outputs back to the source, in the order they were sent

torch.distributed.all_to_all_single handles uneven (and empty) splits on both NCCL and gloo (gloo's
alltoallv, checked on torch 2.13), so no send/recv fallback is needed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from infersight.runtime.parallel.placement import RouteTables


def shard_sizes(n_tokens: int, world: int) -> list[int]:
    """Tokens sourced by each rank: contiguous, sizes differing by at most one (first ranks larger)."""
    base, extra = divmod(n_tokens, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


@dataclass(frozen=True)
class DispatchPlan:
    """Where a source rank's pairs go. Pair p is (token p // top_k, slot p % top_k) of the shard."""

    send_pairs: torch.Tensor   # [N] pair indices, in send order (destination rank, slot, token)
    send_counts: torch.Tensor  # [W, S] pairs per destination rank and destination local slot


def plan_dispatch(flat_experts: torch.Tensor, tables: RouteTables, world: int,
                  earlier_pairs: torch.Tensor) -> DispatchPlan:
    """flat_experts [N]: the expert of each pair of this rank's shard. earlier_pairs [E]: the
    pairs routed to each expert before this shard's: in the layer's earlier forwards and in the
    lower ranks' shards of this one (every rank routes every token, so each knows both without a
    collective).

    A pair for an expert with c copies goes to copy g % c, g = earlier_pairs[e] + its position
    among this shard's pairs for e (token order): one round robin over all sources and steps, so
    over a run the copies' loads differ by at most one pair, the even split the replication plan
    predicts. (Offsetting each source's own count by its rank instead left an error of up to a pair
    per copy, source and step: at W = 8 with 2 tokens per shard the measured balance missed the
    prediction by up to 0.22 of the mean.) Without replicas every expert has one copy, its home rank."""
    n = flat_experts.numel()
    order = torch.argsort(flat_experts, stable=True)  # by expert, then token
    sorted_experts = flat_experts[order]
    per_expert = torch.bincount(flat_experts, minlength=tables.n_replicas.numel())
    first = torch.cumsum(per_expert, 0) - per_expert
    position = torch.arange(n, device=flat_experts.device) - first[sorted_experts]
    copy = (position + earlier_pairs[sorted_experts]) % tables.n_replicas[sorted_experts]
    dest_rank = tables.replica_rank[sorted_experts, copy]
    dest_slot = tables.replica_slot[sorted_experts, copy]
    key = dest_rank * tables.max_slots + dest_slot
    by_dest = torch.argsort(key, stable=True)  # stable: tokens stay ascending within a slot
    counts = torch.bincount(key, minlength=world * tables.max_slots).view(world, tables.max_slots)
    return DispatchPlan(order[by_dest], counts)


class Exchange:
    """The three collectives, on one process group."""

    def __init__(self, group: dist.ProcessGroup | None, world: int) -> None:
        self.group, self.world = group, world

    def counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """[W, S] sent counts -> [W, S] received counts (row s: what source s sends this rank)."""
        recv = torch.empty_like(send_counts)
        dist.all_to_all_single(recv.view(-1), send_counts.reshape(-1).contiguous(), group=self.group)
        return recv

    def rows(self, send: torch.Tensor, send_split: list[int], recv_split: list[int]) -> torch.Tensor:
        """All-to-all of rows: send_split[p] rows to rank p, recv_split[s] rows from rank s."""
        recv = send.new_empty((sum(recv_split), *send.shape[1:]))
        dist.all_to_all_single(recv, send.contiguous(), output_split_sizes=recv_split,
                               input_split_sizes=send_split, group=self.group)
        return recv

    def all_gather_rows(self, shard: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Every rank's shard, concatenated in rank order (shards padded to the largest size)."""
        width = max(sizes)
        padded = shard.new_zeros((width, *shard.shape[1:]))
        padded[: shard.shape[0]] = shard
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])
