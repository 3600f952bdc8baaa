"""An observer that forwards to one of several observers, switchable between steps.

The overhead benchmark runs one engine and flips what observes it, so "probes off", "NVTX only"
and "all probes" are compared on the same weights, KV memory and batch, step by step. The extra
forwarding call is paid equally by every variant, "off" included.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ContextManager

from infersight.runtime.observer import EngineObserver, KVBlockEvent
from infersight.runtime.ranges import RangeMarker

if TYPE_CHECKING:
    import torch

    from infersight.runtime.model.model_config import ModelConfig
    from infersight.runtime.stats import StepStats


class SwitchRanges(RangeMarker):
    def __init__(self, current: RangeMarker) -> None:
        self.current = current

    def range(self, name: str) -> ContextManager[None]:
        return self.current.range(name)

    def begin_step(self, step_id: int) -> None:
        self.current.begin_step(step_id)


class SwitchObserver(EngineObserver):
    def __init__(self, variants: dict[str, EngineObserver], initial: str) -> None:
        self.variants = variants
        self.ranges = SwitchRanges(variants[initial].ranges)
        self.wants_expert_counts = any(v.wants_expert_counts for v in variants.values())
        self.current = variants[initial]
        self.select(initial)

    @property
    def decode_graphs_while_profiling(self) -> bool:  # type: ignore[override]
        return self.current.decode_graphs_while_profiling

    def select(self, name: str) -> None:
        self.current = self.variants[name]
        self.ranges.current = self.current.ranges

    def on_model(self, model: "ModelConfig", dtype_bytes: int) -> None:
        for variant in self.variants.values():  # once, at build: every variant may capture later
            variant.on_model(model, dtype_bytes)

    def on_request_arrived(self, request_id: int, t_ns: int, num_prompt_tokens: int, task: str | None,
                           trace_id: int) -> None:
        self.current.on_request_arrived(request_id, t_ns, num_prompt_tokens, task, trace_id)

    def on_request_scheduled(self, request_id: int, t_ns: int, num_prompt_tokens: int, num_cached_tokens: int,
                             prefix_group_hash: int) -> None:
        self.current.on_request_scheduled(request_id, t_ns, num_prompt_tokens, num_cached_tokens, prefix_group_hash)

    def on_prefill_chunk(self, request_id: int, start_ns: int, end_ns: int, start_pos: int, num_tokens: int) -> None:
        self.current.on_prefill_chunk(request_id, start_ns, end_ns, start_pos, num_tokens)

    def on_first_token(self, request_id: int, t_ns: int) -> None:
        self.current.on_first_token(request_id, t_ns)

    def on_tokens_emitted(self, request_id: int, t_ns: int, num_tokens: int) -> None:
        self.current.on_tokens_emitted(request_id, t_ns, num_tokens)

    def on_tokens_emitted_many(self, request_ids: list[int], t_ns: int, num_tokens: list[int]) -> None:
        self.current.on_tokens_emitted_many(request_ids, t_ns, num_tokens)

    def on_request_preempted(self, request_id: int, t_ns: int, reason: str) -> None:
        self.current.on_request_preempted(request_id, t_ns, reason)

    def on_request_resumed(self, request_id: int, t_ns: int) -> None:
        self.current.on_request_resumed(request_id, t_ns)

    def on_request_finished(self, request_id: int, t_ns: int, reason: str, num_output_tokens: int) -> None:
        self.current.on_request_finished(request_id, t_ns, reason, num_output_tokens)

    def on_kv_block(self, event: KVBlockEvent, block_id: int, request_id: int, block_hash: int) -> None:
        self.current.on_kv_block(event, block_id, request_id, block_hash)

    def on_expert_counts(self, step_id: int, counts: "torch.Tensor") -> None:
        if self.current.wants_expert_counts:
            self.current.on_expert_counts(step_id, counts)

    def on_spec_verified(self, request_id: int, num_proposed: int, num_accepted: int, accept_mask: list[bool],
                         draft_ns: int, verify_ns: int) -> None:
        self.current.on_spec_verified(request_id, num_proposed, num_accepted, accept_mask, draft_ns, verify_ns)

    def on_step_begin(self, step_id: int, t_ns: int) -> None:
        self.current.on_step_begin(step_id, t_ns)

    def on_step_end(self, stats: "StepStats") -> None:
        self.current.on_step_end(stats)
