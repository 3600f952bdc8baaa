"""The agent's component protocol: what one part of the agent (the GPU telemetry, the flight
recorder, tracing, Parquet, an engine source, ...) does in each poll, and what it adds to /metrics.

    Agent.poll_once
      ├─ part.start_poll()                      every part, in order (the GPU's readings come first)
      ├─ for each ring's batch: AgentState.ingest(frames), then
      │    part.on_frames(frames, ring_index, anchor)   every part, then the ring's commit
      └─ part.end_poll(had_batches)             every part, in order
    Agent.__init__: registry.register(part.collector()) for each part that has one

The agent builds its list of parts once, in its constructor, and loops over it; a part never reaches
into another's attributes: what it needs is passed to its constructor (OpenTelemetry's processor
list and client_python's collector registry are the models). `name` is the poll guard's label
(agent.poll_guard): a hook that raises is counted under it and the poll goes on.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from prometheus_client.registry import Collector

from infersight.correlate.frames import EventFrames


@runtime_checkable
class AgentComponent(Protocol):
    name: str

    def start_poll(self) -> None:
        """Before the rings are read."""

    def on_frames(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        """One ring's batch, after AgentState ingested it. anchor: the ring's (wall ns, monotonic ns)."""

    def end_poll(self, had_batches: bool) -> None:
        """After every ring's batch; had_batches: whether any ring had data this poll."""

    def collector(self) -> Collector | None:
        """What this part adds to /metrics (None: nothing), registered once by the agent."""


class Component:
    """A part that does nothing at every hook: subclasses override the ones they use ("off" is this
    class's no-op, checked nowhere else)."""

    name = "agent"

    def start_poll(self) -> None:
        return None

    def on_frames(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        return None

    def end_poll(self, had_batches: bool) -> None:
        return None

    def collector(self) -> Collector | None:
        return None
