"""The expert-parallel MoE FFN: the router and shared expert replicated, routed experts sharded.

It computes exactly what MoEFFN.forward computes, bit for bit (the test suite checks generated
tokens against the single-process engine):
- each expert runs once on all the tokens routed to it, in ascending token order (the sources'
  shards are contiguous and arrive in rank order), as a fresh gathered tensor like MoEFFN's x[idx];
- each token's weighted expert outputs are summed into zeros in ascending expert id, the order
  of MoEFFN's per-expert index_add_ loop.
A replicated expert (placement.py) splits its tokens over its copies, which changes the shapes its
matmuls see: outputs then agree with MoEFFN to rounding only.
"""
from __future__ import annotations

import torch
from torch import nn

from infersight.runtime.model.moe import MoEFFN, route
from infersight.runtime.model.moe_experts import expert_histogram
from infersight.runtime.parallel.exchange import Exchange, plan_dispatch, shard_sizes
from infersight.runtime.parallel.group import EPGroup
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPStatsCollector
from infersight.runtime.ranges import RangeMarker


def ep_range_names(layer_idx: int) -> dict[str, str]:
    """The per-layer range names of the expert-parallel MoE (router and experts as in MoEFFN)."""
    prefix = f"layer.{layer_idx}.moe"
    return {part: f"{prefix}.{part}" for part in ("router", "dispatch", "experts", "combine", "gather")}


class ExpertParallelMoE(MoEFFN):
    """A MoEFFN whose experts live on the ranks of `group` as `placement` says.

    It subclasses MoEFFN so that DecoderLayer passes it the step's expert counter unchanged, but it
    is built from an existing MoEFFN and keeps only this rank's experts (as local_experts)."""

    def __init__(self, moe: MoEFFN, layer_idx: int, group: EPGroup, placement: LayerPlacement,
                 stats: EPStatsCollector, ranges: RangeMarker, device: torch.device | str | None = None) -> None:
        # Not MoEFFN.__init__: that would allocate every expert again. Take the built parts instead.
        # moe may still be on the meta device (local_model.py materialises only what is kept):
        # device is where the routing tables go, by default the router's device.
        nn.Module.__init__(self)
        if placement.n_experts != moe.n_experts or placement.world != group.world:
            raise ValueError(f"placement for {placement.n_experts} experts on {placement.world} ranks does "
                             f"not fit a layer of {moe.n_experts} experts on {group.world} ranks")
        self.layer_idx, self.group, self.placement, self.stats = layer_idx, group, placement, stats
        self.top_k, self.n_experts, self.renormalise = moe.top_k, moe.n_experts, moe.renormalise
        self.router, self.shared = moe.router, moe.shared
        self.local_ids = placement.slots[group.rank]
        self.local_experts = nn.ModuleList(moe.experts[e] for e in self.local_ids)
        self.ranges, self.names = ranges, ep_range_names(layer_idx)
        self.tables = placement.tables(device if device is not None else moe.router.weight.device)
        # Pairs routed to each expert by this layer so far, the same on every rank (all route every
        # token): where each replicated expert's round robin over its copies stands (plan_dispatch).
        # Not a buffer: to_empty would leave a buffer of a meta-built layer uninitialised.
        self.routed_so_far = torch.zeros(moe.n_experts, dtype=torch.long, device=self.tables.n_replicas.device)
        self.exchange = Exchange(group.group, group.world)
        # The all-to-alls take their split sizes on the host: this layer syncs every call, so a decode
        # step holding it must stay eager (cuda_graphs.moe_syncs_host reads this, as for MoEFFN).
        self.expert_path = "loop"

    def forward(self, x: torch.Tensor, expert_counts: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, d], identical on every rank. expert_counts, when given, counts only the pairs this
        rank sources, so the ranks' counters sum to the single-process counter."""
        mark, names, ranges = self.stats.clock.mark, self.names, self.ranges
        rank, world, k = self.group.rank, self.group.world, self.top_k
        start = mark()
        with ranges.range(names["router"]):
            weights, expert_ids = route(self.router(x), k, self.renormalise)
        sizes = shard_sizes(x.shape[0], world)
        lo = sum(sizes[:rank])
        shard, ids, w = x[lo:lo + sizes[rank]], expert_ids[lo:lo + sizes[rank]], weights[lo:lo + sizes[rank]]
        if expert_counts is not None:
            expert_counts += torch.bincount(ids.flatten(), minlength=self.n_experts)
        with ranges.range(names["dispatch"]):
            d0 = mark()
            # expert_histogram, not bincount: bincount on CUDA reads its input's max on the host
            earlier = self.routed_so_far + expert_histogram(expert_ids[:lo], self.n_experts)
            plan = plan_dispatch(ids.flatten(), self.tables, world, earlier)
            self.routed_so_far += expert_histogram(expert_ids, self.n_experts)
            recv_counts = self.exchange.counts(plan.send_counts)
            # One host sync for both split lists: all_to_all_single takes the splits as Python ints.
            host = torch.cat([plan.send_counts.sum(1), recv_counts.flatten()]).tolist()
            send_split, recv_counts_host = host[:world], host[world:]
            width = self.tables.max_slots
            recv_per_source = [sum(recv_counts_host[s * width:(s + 1) * width]) for s in range(world)]
            received = self.exchange.rows(shard[plan.send_pairs // k], send_split, recv_per_source)
            d1 = mark()
        with ranges.range(names["experts"]):
            expert_out, slot_tokens = self._run_local(received, recv_counts_host)
            c1 = mark()
        with ranges.range(names["combine"]):
            back = self.exchange.rows(expert_out, recv_per_source, send_split)
            out = self._weighted_sum(back, plan.send_pairs, ids, w, x.dtype)
            m1 = mark()
        with ranges.range(names["gather"]):
            g0 = mark()
            out = self.exchange.all_gather_rows(out, sizes)
            g1 = mark()
        if self.shared is not None:
            out = out + self.shared(x)
        row_bytes = x.shape[1] * x.element_size()
        self.stats.record(self.layer_idx, (start, d0, d1, c1, m1, g0, g1, mark()),
                          [n * row_bytes for n in send_split], self.local_ids, slot_tokens)
        return out

    def _run_local(self, received: torch.Tensor, recv_counts: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Run each local expert on its received rows. received is grouped by (source, slot);
        recv_counts is the flattened [W, S] count table. Returns (outputs in received order,
        rows per local slot)."""
        world, width = self.group.world, self.tables.max_slots
        counts = torch.tensor(recv_counts, dtype=torch.long, device=received.device)
        slot_of_row = torch.arange(width, device=received.device).repeat(world).repeat_interleave(counts)
        by_slot = torch.argsort(slot_of_row, stable=True)  # (slot, source, token): ascending tokens per slot
        per_slot = [sum(recv_counts[s * width + j] for s in range(world)) for j in range(len(self.local_ids))]
        out = torch.empty_like(received)
        start = 0
        for j, n in enumerate(per_slot):
            if n:
                idx = by_slot[start:start + n]
                out[idx] = self.local_experts[j](received[idx])
                start += n
        return out, per_slot

    def _weighted_sum(self, back: torch.Tensor, send_pairs: torch.Tensor, ids: torch.Tensor,
                      weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """back: expert outputs in send order -> [shard tokens, d], each token's weighted outputs
        added into zeros in ascending expert id (MoEFFN's summation order, so results match bit for bit)."""
        n_tokens, k = ids.shape
        per_pair = torch.empty_like(back)
        per_pair[send_pairs] = back
        per_pair = per_pair * weights.flatten().unsqueeze(-1).to(dtype)
        per_pair = per_pair.view(n_tokens, k, back.shape[-1])
        by_expert = torch.argsort(ids, dim=1, stable=True)
        per_pair = torch.gather(per_pair, 1, by_expert.unsqueeze(-1).expand_as(per_pair))
        out = back.new_zeros((n_tokens, back.shape[-1]))
        for j in range(k):
            out = out + per_pair[:, j]
        return out

    def forward_train(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError("expert-parallel layers serve inference only; train the single-process model")
