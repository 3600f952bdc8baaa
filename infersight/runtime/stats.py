"""Plain per-step statistics returned by Engine.step(); the engine never prints or aggregates."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    step_id: int
    start_ns: int
    end_ns: int
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_spec_tokens: int = 0            # draft tokens verified this step
    num_spec_accepted: int = 0
    kv_blocks_in_use: int = 0
    kv_blocks_cached: int = 0          # free but holding reusable prefix content
    kv_blocks_total: int = 0
    kv_block_size: int = 0
    num_waiting: int = 0
    num_running: int = 0
    num_swapped: int = 0
    num_preempted: int = 0
    batch: list[tuple[int, int]] = field(default_factory=list)  # (request_id, tokens fed this step)
    context_lens: list[int] = field(default_factory=list)  # per batch entry: its KV length after the step
    phase: str = ""                    # the target forward's: prefill, decode, mixed or verify ("" idle)
    # Where the step's time went (ns; the rest of end_ns - start_ns is sampling, verification, commit).
    schedule_ns: int = 0
    draft_ns: int = 0                  # every draft forward (catch-up + one per drafted position), with sampling
    draft_forwards: int = 0            # draft forwards that proposed tokens (the longest draft's length)
    target_ns: int = -1                # the target forward (device time on CUDA); -1 when not known
    launched_ahead: bool = False       # async scheduling: launched before the step before it was read
    # Async scheduling: the step after it was launched before it was read. A step launched ahead and
    # followed by one launched ahead is a steady async step (its interval holds one launch and one
    # read); the first and last of a run are not (spec_step_costs prices plain probe runs by it).
    launched_next: bool = False
    spec_probe: bool = False           # a decode step the engine ran without speculation (spec_probe_every)
    # CUDA graphs captured during the step: a one-time cost (warm-up, capture, Triton JIT of its
    # shapes) that makes the step no sample of the steady step time (spec_speedup leaves it out).
    graph_captures: int = 0
    # torch.profiler was recording (a capture or flight-recorder window): the step ran eagerly (no
    # graph replay, cuda_graphs.graph_step_allowed) under the profiler's callbacks, so it is no sample
    # of the steady step time either.
    profiled: bool = False
    # Requests the step's schedule preempted or swapped back in: KV pressure, whose time (offload and
    # reload copies, on the H200's demo ~30 ms a step) is spent moving memory, not decoding, and is no
    # sample of the steady step time either.
    kv_moves: int = 0
    finished: list[int] = field(default_factory=list)
