"""The engine's observer protocol: every state transition calls one of these methods.

The engine holds exactly one observer; "off" is this base class, whose methods do nothing, so the
engine never branches on whether anyone listens. Timestamps are time.monotonic_ns() of the engine
process. Implementations must not block or raise: they run inside the engine loop.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from infersight.runtime.ranges import RangeMarker

if TYPE_CHECKING:
    from infersight.runtime.engine.run_policy import RunPolicy
    import torch

    from infersight.runtime.model.model_config import ModelConfig
    from infersight.runtime.stats import StepStats


class KVBlockEvent(enum.IntEnum):
    """Life of a device KV block. Values are stable: they are written into probe records."""

    ALLOCATED = 1     # handed to a request, empty
    PREFIX_HIT = 2    # a cached block reused by a request (ref count +1)
    FREED = 3         # ref count reached 0, nothing reusable in it
    CACHED = 4        # ref count reached 0, kept for prefix reuse
    EVICTED = 5       # a cached free block's content dropped to reuse the block (request: the allocating one)
    OFFLOADED = 6     # copied to the CPU tier when its request was swapped out
    RELOADED = 7      # copied back from the CPU tier
    RECOMPUTED = 8    # filled again with content that had been evicted (wasted work)
    RESUME_HIT = 9    # a cached block taken again by a preempted request on re-admission: not a prefix hit


class EngineObserver:
    """No-op observer. Subclass and override what you need."""

    #: Set True to have the model count tokens per (layer, expert) on the device each step.
    wants_expert_counts: bool = False
    #: What marks the engine's phases (NVTX, record_function); the base marks nothing.
    ranges: RangeMarker = RangeMarker()
    #: True while this observer's capture window wants decode steps to replay their CUDA graphs under
    #: torch.profiler (a kernel-activity window: probes.control.CaptureDecode.GRAPHS); False keeps the
    #: eager path whenever the profiler records (per-layer ranges). Read by the engine once per step.
    decode_graphs_while_profiling: bool = False

    def on_model(self, model: "ModelConfig", dtype_bytes: int) -> None:
        """Once, when the engine has built its (target) model: the shape a capture's work is modelled on."""

    # -- requests -------------------------------------------------------------------------
    def on_request_arrived(self, request_id: int, t_ns: int, num_prompt_tokens: int,
                           task: str | None, trace_id: int) -> None: ...

    def on_request_scheduled(self, request_id: int, t_ns: int, num_prompt_tokens: int,
                             num_cached_tokens: int, prefix_group_hash: int) -> None: ...

    def on_prefill_chunk(self, request_id: int, start_ns: int, end_ns: int, start_pos: int,
                         num_tokens: int) -> None: ...

    def on_first_token(self, request_id: int, t_ns: int) -> None: ...

    def on_tokens_emitted(self, request_id: int, t_ns: int, num_tokens: int) -> None: ...

    def on_tokens_emitted_many(self, request_ids: list[int], t_ns: int, num_tokens: list[int]) -> None:
        """A step's emissions at one time: request_ids[i] gained num_tokens[i] tokens. The engine calls
        it once per step for the requests whose tokens did not finish them (those go through
        on_tokens_emitted, before their FINISHED). The lists are the observer's to keep: the caller
        never changes them. Raise only having recorded none of them: the engine then offers each
        alone (a failure there ends that request only). A subclass that overrides only
        on_tokens_emitted gets them one call each (__init_subclass__)."""

    def _each_emitted(self, request_ids: list[int], t_ns: int, num_tokens: list[int]) -> None:
        for rid, n in zip(request_ids, num_tokens):
            self.on_tokens_emitted(rid, t_ns, n)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # Off (this class) must cost one no-op call a step, not one per request: only an observer
        # that listens to on_tokens_emitted alone is handed the batch one emission at a time.
        if (cls.on_tokens_emitted is not EngineObserver.on_tokens_emitted
                and cls.on_tokens_emitted_many is EngineObserver.on_tokens_emitted_many):
            cls.on_tokens_emitted_many = EngineObserver._each_emitted  # type: ignore[method-assign]

    def on_request_preempted(self, request_id: int, t_ns: int, reason: str) -> None: ...

    def on_request_resumed(self, request_id: int, t_ns: int) -> None: ...

    def on_request_finished(self, request_id: int, t_ns: int, reason: str, num_output_tokens: int) -> None: ...

    # -- KV blocks --------------------------------------------------------------------------
    def on_kv_block(self, event: KVBlockEvent, block_id: int, request_id: int, block_hash: int) -> None: ...

    # -- MoE, speculation, steps ------------------------------------------------------------
    def on_expert_counts(self, step_id: int, counts: "torch.Tensor") -> None:
        """counts [n_layers, n_experts] tokens routed this step: on the device after a synchronous step, already
        on the host (pinned, copied behind the step) after a step launched by async scheduling. The engine
        reuses the tensor for later steps: copy what you keep."""

    def on_spec_verified(self, request_id: int, num_proposed: int, num_accepted: int,
                         accept_mask: list[bool], draft_ns: int, verify_ns: int) -> None: ...

    def on_step_begin(self, step_id: int, t_ns: int) -> None: ...

    def on_step_end(self, stats: "StepStats") -> None: ...

    # -- the run-time policy (runtime.engine.run_policy): set by an agent while the engine runs ------
    def policy_update(self) -> "RunPolicy | None":
        """A policy newer than the last one returned, or None (no change: the engine asks each step, so
        this must cost next to nothing; the probes' observer reads it from its control block)."""
        return None

    def on_policy_limits(self, max_num_seqs: int) -> None:
        """Once, at the engine's start: the configured limit a policy's max_num_seqs may only lower."""

    def on_policy_arm(self, request_id: int, t_ns: int, arm: int, policy_seq: int) -> None:
        """A request arrived under policy `policy_seq` in canary arm `arm` (run_policy.PolicyArm); only
        while a policy is set (policy_seq > 0)."""
