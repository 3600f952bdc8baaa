"""Attach to probe rings (by name or discovered), read them, decode batches into EventFrames.

A ring that is missing or unreadable is logged once per retry interval and retried; it never
stops the agent. Each batch goes through the agent's RecordScreen (agent.rings.record_limits) before it
is decoded: records out of range or over the agent's limits are counted, never decoded. Request
ids are per engine process, so with several rings each ring's ids are shifted into their own range
(ring index << 48); a ring index is a segment's, so an engine that restarts under its
predecessor's ring name (its pid, in a new pid namespace) gets a new one. A ring whose writer
died (stopped beating, or its pid exited) is drained, detached and counted (`dead`). A ring's
GPU records (the GPUs its engine uses, by UUID) are kept on the ring,
at most MAX_GPUS_PER_RING, for the selection of the node's GPU series (gpu.selection). A ring's
ENGINE record names the engine it belongs to (the `engine` label, agent.rings.engine_scope): the first name
it announces is kept (a producer cannot grow the label's values); until one comes (an old ring, or the
seconds before a ring another agent read announces it again) the ring's own name stands for it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from infersight.agent.rings.record_limits import RecordLimits, RecordScreen
from infersight.correlate.frames import EventFrames
from infersight.probes.records import RecordKind, engine_name_of, record_registry
from infersight.probes.ring import RingConsumer, RingFormatError, RingWriterGone
from infersight.probes.ring_discovery import RingDiscovery

log = logging.getLogger("infersight.agent")
RING_ID_SHIFT = 48
#: GPUs one engine may report (a GPU record beyond them is ignored: a corrupt producer cannot grow it).
MAX_GPUS_PER_RING = 64


@dataclass
class AttachedRing:
    name: str
    index: int
    consumer: RingConsumer
    labels: dict[int, str] = field(default_factory=lambda: {0: "other"})
    gpu_uuids: set[str] = field(default_factory=set)  # from its GPU records
    announced: str | None = None  # the engine's name, from its first ENGINE record

    @property
    def engine(self) -> str:
        """The engine this ring belongs to: the name it announced, else the ring's own."""
        return self.announced or self.name

    def note_engine(self, records: dict[int, np.ndarray]) -> None:
        if self.announced is None and int(RecordKind.ENGINE) in records:
            names = [engine_name_of(raw) for raw in records[int(RecordKind.ENGINE)]["name"].tolist()]
            self.announced = next((n for n in names if n), None)

    def note_gpus(self, records: dict[int, np.ndarray]) -> None:
        for raw in records.get(int(RecordKind.GPU), np.empty(0, dtype=[("uuid", "S1")]))["uuid"].tolist():
            uuid = bytes(raw).rstrip(b"\0").decode("ascii", "replace")
            if uuid and len(self.gpu_uuids) < MAX_GPUS_PER_RING:
                self.gpu_uuids.add(uuid)


class RingSet:
    def __init__(self, names: list[str], discover: bool, retry_interval_s: float = 2.0,
                 prefix: str = "infersight-", limits: RecordLimits | None = None) -> None:
        self.wanted = list(names)
        self.discover = discover
        self.prefix = prefix
        self.retry_interval_s = retry_interval_s
        self.attached: dict[str, AttachedRing] = {}
        self._next_try: dict[str, float] = {}
        self._registry = record_registry()
        self._indices: dict[tuple[str, int, int], int] = {}  # (name, creation anchor) -> ring index
        self.screen = RecordScreen(limits if limits is not None else RecordLimits())
        # Discovered rings another agent reads are passed over: logged once, counted, retried (ring_discovery)
        self.discovery = RingDiscovery(prefix, retry_interval_s)

    @property
    def dead(self) -> int:
        """Rings whose writer died without closing them while attached (RingWriterGone.dead)."""
        return self.discovery.dead

    def _index(self, consumer: RingConsumer) -> int:
        """The segment's index: the same on a re-attach, a new one for a new ring of an old name."""
        return self._indices.setdefault((consumer.name, *consumer.anchor), len(self._indices))

    def refresh(self) -> None:
        """Attach wanted (and, with discover, newly appeared) rings; failures are retried later."""
        names = list(self.wanted)
        if self.discover:  # every live probe ring no other agent reads (never the capture control blocks)
            names += [n for n in self.discovery.candidates(skip=self.attached) if n not in names]
        now = time.monotonic()
        for name in names:
            if name in self.attached or now < self._next_try.get(name, 0.0):
                continue
            try:
                consumer = RingConsumer.attach(name, self._registry)
            except FileNotFoundError:
                log.warning("ring %r not found (is the engine running with probes on?); retrying in %.0f s",
                            name, self.retry_interval_s)
            except (RingFormatError, ValueError, OSError) as exc:
                log.warning("ring %r cannot be read: %s; retrying in %.0f s", name, exc, self.retry_interval_s)
            else:
                self.attached[name] = AttachedRing(name, self._index(consumer), consumer)
                log.info("attached to ring %r", name)
                continue
            self._next_try[name] = now + self.retry_interval_s

    def read(self) -> list[tuple[AttachedRing, EventFrames]]:
        """One batch per attached ring that had records."""
        out = []
        for ring in list(self.attached.values()):
            try:
                records = ring.consumer.read()
            except RingWriterGone as exc:
                log.warning("%s; detaching", exc)
                self.discovery.dead += exc.dead  # died without closing it: counted
                self.detach(ring.name)
                continue
            except RingFormatError as exc:
                log.error("ring %r became unreadable (%s); detaching", ring.name, exc)
                self.detach(ring.name)
                continue
            if not records:
                continue
            ring.note_gpus(records)
            ring.note_engine(records)
            records, ring.labels = self.screen.screen(ring.name, records, ring.labels)
            frames = EventFrames.from_records(records, ring.labels)
            if ring.index:
                offset = np.int64(ring.index) << RING_ID_SHIFT
                for df in (frames.request_events, frames.batch, frames.spec, frames.prefix, frames.network,
                           frames.served, frames.texts):
                    df["request_id"] += offset
                for df in (frames.steps, frames.batch, frames.moe, frames.step_timing):  # step ids are per engine too
                    df["step_id"] += offset
                frames.host_pauses["ring_index"] = ring.index  # whose requests they stalled
                mask = frames.kv_events["request_id"] >= 0
                frames.kv_events.loc[mask, "request_id"] += offset
            out.append((ring, frames))
        return out

    def gpu_uuids(self) -> frozenset[str]:
        """The GPUs the attached rings' engines reported using."""
        return frozenset(u for ring in self.attached.values() for u in ring.gpu_uuids)

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: ring.consumer.stats() for name, ring in self.attached.items()}

    def detach(self, name: str) -> None:
        ring = self.attached.pop(name, None)
        if ring is not None:
            ring.consumer.close()
            self._next_try[name] = time.monotonic() + self.retry_interval_s

    def close(self) -> None:
        for name in list(self.attached):
            self.detach(name)
