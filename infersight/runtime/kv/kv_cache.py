"""KV storage and per-request block tables: prefix hits, slot allocation, CPU swap tier.

Target and draft models share block ids (each has its own KV tensors), so one block table
serves both. A request's table covers positions [0, len(table) * block_size):

    block_table = [4, 9, 2]   block_size = 4
    positions     0-3 -> block 4 | 4-7 -> block 9 | 8-11 -> block 2
"""
from __future__ import annotations

import torch

from infersight.runtime.config import EngineConfig, ModelConfig
from infersight.runtime.kv.kv_pool import KVBlockPool, block_hash
from infersight.runtime.observer import EngineObserver, KVBlockEvent
from infersight.runtime.engine.request import Request


def _kv_tensors(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                device: str, pin: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
    k = torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)
    v = torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)
    return k, v


class KVCacheManager:
    def __init__(self, config: EngineConfig, observer: EngineObserver) -> None:
        assert config.num_kv_blocks is not None
        self.block_size = config.block_size
        self.enable_prefix_caching = config.enable_prefix_caching
        self.pool = KVBlockPool(config.num_kv_blocks, observer)
        self.observer = observer
        self.ranges = observer.ranges
        models = [config.model_config] + ([config.draft_config] if config.draft_config else [])
        dtype, device = config.torch_dtype, config.device
        # On CUDA one spare block past the pool: CUDA-graph padding rows write their K/V there (cuda_graphs).
        spare = 1 if device.startswith("cuda") else 0
        self.device_kv = [_kv_tensors(m, config.num_kv_blocks + spare, self.block_size, dtype, device)
                          for m in models]
        pin = device.startswith("cuda")
        self.cpu_kv = [_kv_tensors(m, config.cpu_offload_blocks, self.block_size, dtype, "cpu", pin)
                       for m in models] if config.cpu_offload_blocks else []
        self.cpu_free: list[int] = list(range(config.cpu_offload_blocks))[::-1]
        self.cpu_tables: dict[int, list[int]] = {}

    # -- hashing -----------------------------------------------------------------------------
    def _hashes(self, tokens: list[int], n_blocks: int) -> list[int]:
        hashes, prev = [], 0
        bs = self.block_size
        for i in range(n_blocks):
            prev = block_hash(prev, tokens[i * bs:(i + 1) * bs])
            hashes.append(prev)
        return hashes

    def prefix_group_hash(self, req: Request) -> int:
        """The first full block's hash: requests sharing a system prompt share it (0 if shorter)."""
        if len(req.prompt_token_ids) < self.block_size:
            return 0
        return self._hashes(req.prompt_token_ids, 1)[0]

    # -- admission ---------------------------------------------------------------------------
    def find_prefix_hits(self, req: Request) -> list[int]:
        """Cached blocks matching the request's leading full blocks. At least one token is always
        left to compute, since the last position's logits are needed."""
        if not self.enable_prefix_caching:
            return []
        tokens = req.token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        hits = []
        for i, h in enumerate(self._hashes(tokens, max_blocks)):
            bid = self.pool.lookup(h, tokens[i * self.block_size:(i + 1) * self.block_size])
            if bid is None:
                break
            hits.append(bid)
        return hits

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        total = -(-(req.num_computed + num_new_tokens) // self.block_size)
        return max(0, total - len(req.block_table))

    def can_admit(self, req: Request, hits: list[int], num_new_tokens: int) -> bool:
        # Hit blocks sitting in the free list stop being free once acquired.
        hit_free = sum(1 for b in hits if self.pool.blocks[b].ref_count == 0)
        need = -(-(len(hits) * self.block_size + num_new_tokens) // self.block_size) - len(hits)
        return self.pool.can_allocate(need + hit_free)

    def admit(self, req: Request, hits: list[int]) -> None:
        """Take the prefix hits: their tokens count as computed for both models. A preempted request
        coming back (recompute) often finds its own blocks cached: that reuse is a RESUME_HIT, not a
        prefix hit, so hits stay counted once per request (vLLM counted them again: #25780)."""
        event = KVBlockEvent.RESUME_HIT if req.num_preemptions else KVBlockEvent.PREFIX_HIT
        for bid in hits:
            self.pool.acquire_cached(bid, req.request_id, event)
        req.block_table = list(hits)
        req.num_cached_blocks = len(hits)
        # a hit is registered under the hash it matched: the last one's is the chain's so far
        req.last_cached_hash = self.pool.blocks[hits[-1]].block_hash if hits else 0
        req.num_computed = req.draft_computed = len(hits) * self.block_size

    # -- running -----------------------------------------------------------------------------
    def can_allocate_slots(self, req: Request, num_new_tokens: int) -> bool:
        return self.pool.can_allocate(self.blocks_needed(req, num_new_tokens))

    def allocate_slots(self, req: Request, num_new_tokens: int) -> None:
        """Extend the table to cover positions [0, num_computed + num_new_tokens)."""
        req.block_table += self.pool.allocate(self.blocks_needed(req, num_new_tokens), req.request_id)

    def commit(self, req: Request, recomputed: bool = True) -> None:
        """Register blocks that became full and computed (by both models) in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        computed = min(req.num_computed, req.draft_computed) if self.draft_enabled else req.num_computed
        # Accepted draft tokens have KV before _emit appends them to token_ids: hash only known tokens.
        computed = min(computed, req.num_tokens)
        n_full = min(computed // self.block_size, len(req.block_table))
        if n_full <= req.num_cached_blocks:
            return
        tokens = req.token_ids
        bs = self.block_size
        # The chain goes on from the last registered block's hash: hashing from block 0 at every new
        # block made a request's hashing quadratic in its length (~4% of serve's engine thread, H100).
        prev = req.last_cached_hash
        for i in range(req.num_cached_blocks, n_full):
            block_tokens = tokens[i * bs:(i + 1) * bs]
            prev = block_hash(prev, block_tokens)
            self.pool.register(req.block_table[i], prev, block_tokens, req.request_id, recomputed)
        req.num_cached_blocks, req.last_cached_hash = n_full, prev

    @property
    def draft_enabled(self) -> bool:
        return len(self.device_kv) > 1

    def free(self, req: Request) -> None:
        self.pool.release(req.block_table, req.request_id)
        req.block_table = []
        req.num_cached_blocks, req.last_cached_hash = 0, 0

    # -- CPU tier ----------------------------------------------------------------------------
    def can_swap_out(self, req: Request) -> bool:
        return bool(self.cpu_kv) and len(req.block_table) <= len(self.cpu_free)

    def swap_out(self, req: Request) -> None:
        """Copy the request's blocks to the CPU tier and release them on the device."""
        cpu_ids = [self.cpu_free.pop() for _ in req.block_table]
        src = torch.tensor(req.block_table, device=self.device_kv[0][0].device)
        dst = torch.tensor(cpu_ids)
        with self.ranges.range("kv.swap_out"):
            for (dk, dv), (ck, cv) in zip(self.device_kv, self.cpu_kv):
                ck[:, dst] = dk[:, src].to("cpu")
                cv[:, dst] = dv[:, src].to("cpu")
        for bid in req.block_table:
            self.observer.on_kv_block(KVBlockEvent.OFFLOADED, bid, req.request_id, self.pool.blocks[bid].block_hash)
        self.cpu_tables[req.request_id] = cpu_ids
        self.free(req)

    def can_swap_in(self, req: Request) -> bool:
        return self.pool.can_allocate(len(self.cpu_tables[req.request_id]))

    def swap_in(self, req: Request) -> None:
        cpu_ids = self.cpu_tables.pop(req.request_id)
        req.block_table = self.pool.allocate(len(cpu_ids), req.request_id)
        dst = torch.tensor(req.block_table, device=self.device_kv[0][0].device)
        src = torch.tensor(cpu_ids)
        with self.ranges.range("kv.swap_in"):
            for (dk, dv), (ck, cv) in zip(self.device_kv, self.cpu_kv):
                dk[:, dst] = ck[:, src].to(dk.device, non_blocking=True)
                dv[:, dst] = cv[:, src].to(dv.device, non_blocking=True)
        for bid in req.block_table:
            self.observer.on_kv_block(KVBlockEvent.RELOADED, bid, req.request_id, 0)
        self.cpu_free.extend(reversed(cpu_ids))
        req.num_cached_blocks, req.last_cached_hash = 0, 0
        # Register the reloaded full blocks now: left to the next commit, a hash evicted while the
        # request was swapped out would be reported as RECOMPUTED although it was copied back.
        self.commit(req, recomputed=False)

    def drop_swapped(self, req: Request) -> None:
        """Forget a swapped request's CPU copy (it was aborted)."""
        self.cpu_free.extend(reversed(self.cpu_tables.pop(req.request_id, [])))
