"""The probe ring of a vLLM API-server process, shared by the stat logger and the middleware.

vLLM builds both of our objects itself: it instantiates the stat-logger plugin from its entry
point and the ASGI middleware from its import path, and it passes neither anything of ours. So the
one ring per process that the agent reads is reached through ``process_writer()``, a per-process
writer created on first use. That is the one module-level table in this package, because vLLM's
plugin loading leaves no place to inject a shared object. It is keyed by pid, so a forked child
never writes into its parent's ring.

Settings come from the environment of the vLLM server (``VllmProbeSettings.from_env``):
``INFERSIGHT_RING`` (default ``infersight-vllm-<pid>``, found by ``agent --discover``),
``INFERSIGHT_RING_CAPACITY``, ``INFERSIGHT_TASK_LABELS`` (comma-separated allowed labels) and
``INFERSIGHT_MAX_TASK_LABELS`` (as ProbeConfig / TaskLabels), ``INFERSIGHT_ENGINE_NAME`` (the engine's
name on its ENGINE record, shared with its workers' rings: vllm.engine_name), ``INFERSIGHT_EXPORT_CONTENT=1``
(prompt text on REQUEST_TEXT; off by default), ``INFERSIGHT_VLLM_PROBES=0`` (write nothing).

Threads: in vLLM 0.32 the stat logger's ``record()`` runs in AsyncLLM's output-handler task and
the middleware in uvicorn's handlers, both on the API server's one event loop. The ring allows
only ONE producer, so every write still takes a lock. It is uncontended in practice, and it keeps
the ring safe if a vLLM version moves logging to a thread (its code has a TODO to do so).

Nothing here raises into vLLM. A failure (the ring cannot be created, a bad setting, a record
that does not pack) is counted in ``failures`` and logged once per kind; the writer keeps going,
or goes quiet if the ring never came up.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from infersight.probes.config import ProbeConfig, TaskLabels
from infersight.probes.gpu_uuids import visible_gpu_uuids
from infersight.probes.records import (
    GPU_RECORD_EVERY_S, RecordKind, engine_name_bytes, record_registry, record_struct, split_trace_id,
)
from infersight.probes.ring import RingProducer
from infersight.serve.probe_records import ProbeWriter
from infersight.vllm.engine_name import ENGINE_NAME_ENV, engine_name_problem, vllm_engine_name
from infersight.vllm.translate import Record, RequestContext

# A child of vLLM's logger: our lines appear in the server's log, in its format, at its level.
log = logging.getLogger("vllm.infersight")
#: Requests the middleware has described whose FINISHED has not been written yet (oldest dropped first).
MAX_OPEN_CONTEXTS = 65_536


@dataclass(frozen=True)
class VllmProbeSettings:
    """probe: ring name/capacity and task-label bounds, validated by ProbeConfig. problems: settings
    that could not be used (their defaults were), for the writer to log."""

    probe: ProbeConfig
    enabled: bool = True
    export_content: bool = False
    max_text_bytes: int = 32 << 10
    max_id_bytes: int = 256  # task labels, user and session ids taken from requests
    problems: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], pid: int) -> "VllmProbeSettings":
        problems: list[str] = []

        def integer(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = int(raw)
                if value < 1:
                    raise ValueError
                return value
            except ValueError:
                problems.append(f"{name}={raw!r} is not a positive integer; using {default}")
                return default

        problem = engine_name_problem(env)
        if problem is not None:
            problems.append(problem)
        labels = env.get("INFERSIGHT_TASK_LABELS", "").strip()
        allowed = tuple(s.strip() for s in labels.split(",") if s.strip()) if labels else None
        probe = ProbeConfig(events=True, nvtx=False, ring_name=env.get("INFERSIGHT_RING") or f"infersight-vllm-{pid}",
                            ring_capacity=max(2, integer("INFERSIGHT_RING_CAPACITY", 1 << 16)),
                            task_labels=allowed, max_task_labels=integer("INFERSIGHT_MAX_TASK_LABELS", 32),
                            engine_name=vllm_engine_name(env))
        return cls(probe, enabled=env.get("INFERSIGHT_VLLM_PROBES", "1").strip() != "0",
                   export_content=env.get("INFERSIGHT_EXPORT_CONTENT", "").strip() == "1", problems=tuple(problems))


class VllmRingWriter:
    """The ring's one producer in this process, created lazily on the first write.

    ``texts`` is `infersight serve`'s REQUEST_TEXT / NETWORK packer (serve.probe_records.ProbeWriter),
    reused as is: it writes through ``self.ring.write`` and ``self.on_network``, which this class
    provides (``ring`` is the writer itself, so those writes take the lock too)."""

    def __init__(self, settings: VllmProbeSettings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.failures: Counter[str] = Counter()
        self.tasks = TaskLabels(settings.probe.task_labels, settings.probe.max_task_labels)
        self.texts = ProbeWriter(self, settings.max_text_bytes)  # type: ignore[arg-type]  # duck-typed probe
        self._lock = threading.Lock()
        self._producer: RingProducer | None = None
        self._quiet = not settings.enabled
        self._contexts: OrderedDict[int, RequestContext] = OrderedDict()
        self._step_id = 0
        self._pack = {kind: record_struct(kind).pack for kind in RecordKind}
        self._threads: set[int] = set()
        self._gpu_uuids: tuple[str, ...] | None = None  # this process's GPUs, found when the ring is created
        self._gpus_due_ns = 0
        # Announced on the ring (set_data_parallel_rank; ProbeConfig's default: the ring's name).
        self.engine_name = settings.probe.engine_name or str(settings.probe.ring_name)
        self._rank_named = False
        for problem in settings.problems:
            log.warning("infersight: %s", problem)

    @property
    def ring(self) -> "VllmRingWriter":
        """What ProbeWriter writes through (``ring.write``)."""
        return self

    @property
    def ring_name(self) -> str:
        return str(self.settings.probe.ring_name)

    # -- failures ---------------------------------------------------------------------------------
    def fail(self, where: str, exc: BaseException) -> None:
        """Count a failure; log the first of each kind (never raises)."""
        self.failures[where] += 1
        if self.failures[where] == 1:
            log.warning("infersight: %s failed (%s: %s); further failures of this kind are only counted",
                        where, type(exc).__name__, exc)

    # -- the ring -----------------------------------------------------------------------------------
    def _ring_locked(self) -> RingProducer | None:
        if self._producer is not None or self._quiet:
            return self._producer
        if os.getpid() != self.pid:  # a forked child: its parent owns this ring
            self._quiet = True
            return None
        name, cap = self.ring_name, self.settings.probe.ring_capacity
        try:
            # A ring of our name left by a dead writer (our pid, reused; in a pod, a restarted container's
            # vLLM is often given its predecessor's pid) is replaced by create, never a live writer's.
            self._producer = RingProducer.create(name, cap, None, record_registry())
        except Exception as exc:  # noqa: BLE001 -- never into vLLM; the writer goes quiet
            self._quiet = True
            self.fail("creating the probe ring", exc)
            return None
        log.info("infersight: writing probe records to ring %r (pid %d)", name, self.pid)
        atexit.register(self.close)
        self._write_gpus_locked()
        return self._producer

    def set_data_parallel_rank(self, rank: int) -> None:
        """The data-parallel rank of the engine this process serves (the stat logger's vLLM config),
        before the ring is created: a rank above 0 is in the engine's name (vllm.engine_name)."""
        with self._lock:
            if self._producer is None and rank > 0 and not self._rank_named:  # the process's loggers share one
                self._rank_named = True
                self.engine_name = vllm_engine_name({ENGINE_NAME_ENV: self.engine_name}, rank)

    def _write_gpus_locked(self) -> None:
        """The engine's name (ENGINE, unless it is the ring's) and the GPUs this process can see (its container's, in a pod), one
        GPU record each: the sidecar keeps the node's dcgm-exporter series of these. Again every
        GPU_RECORD_EVERY_S (next_step_id)."""
        if self._producer is None:
            return
        if self._gpu_uuids is None:
            given = self.settings.probe.gpu_uuids
            self._gpu_uuids = tuple(given) if given is not None else visible_gpu_uuids()
        now = time.monotonic_ns()
        try:
            if self.engine_name != self.ring_name:  # the ring's own name is the agent's default: no record
                self._producer.write(RecordKind.ENGINE, self._pack[RecordKind.ENGINE](now, engine_name_bytes(self.engine_name)))
            for index, uuid in enumerate(self._gpu_uuids):
                self._producer.write(RecordKind.GPU, self._pack[RecordKind.GPU](now, index, uuid.encode()))
        except Exception as exc:  # noqa: BLE001 -- never into vLLM
            self.fail("writing the GPU records", exc)
        self._gpus_due_ns = now + int(GPU_RECORD_EVERY_S * 1e9)

    def open(self) -> bool:
        """Create the ring now (the stat logger does at engine start, so the agent finds it early)."""
        with self._lock:
            return self._ring_locked() is not None

    def _note_thread_locked(self) -> None:
        tid = threading.get_ident()
        if tid not in self._threads and len(self._threads) < 8:
            self._threads.add(tid)
            log.info("infersight: ring %r written from thread %s (%d so far)", self.ring_name,
                     threading.current_thread().name, len(self._threads))

    def write(self, kind: int, data: bytes) -> bool:
        """One packed record (ProbeWriter's path); False if dropped or not written."""
        with self._lock:
            ring = self._ring_locked()
            if ring is None:
                return False
            self._note_thread_locked()
            try:
                return ring.write(kind, data)
            except Exception as exc:  # noqa: BLE001
                self.fail(f"writing a {RecordKind(kind).name} record", exc)
                return False

    def write_records(self, records: Iterable[Record]) -> int:
        """Pack and write translated records under one lock; returns how many landed."""
        written = 0
        with self._lock:
            ring = self._ring_locked()
            if ring is None:
                return 0
            self._note_thread_locked()
            for kind, values in records:
                try:
                    written += ring.write(kind, self._pack[kind](*values))
                except Exception as exc:  # noqa: BLE001
                    self.fail(f"writing a {RecordKind(kind).name} record", exc)
        return written

    def on_network(self, request_id: int, receive_ns: int, first_byte_ns: int, last_byte_ns: int) -> None:
        """NETWORK (ProbeWriter.network's path)."""
        self.write(RecordKind.NETWORK,
                   self._pack[RecordKind.NETWORK](request_id, receive_ns, first_byte_ns, last_byte_ns))

    # -- per-request context, from the middleware to the stat logger ----------------------------------
    def bind(self, request_ids: Iterable[int], trace_id: int, task: str | None) -> RequestContext:
        """Note the trace and task of requests about to reach the engine; a new task label is
        announced (TASK_LABEL) before any record uses its id."""
        with self._lock:
            task_id, new = self.tasks.intern(task)
        if new and task is not None:
            self.write(RecordKind.TASK_LABEL, self._pack[RecordKind.TASK_LABEL](task_id, task.encode()[:32]))
        ctx = RequestContext(*split_trace_id(trace_id), task_id)
        with self._lock:
            for rid in request_ids:
                self._contexts[rid] = ctx
                self._contexts.move_to_end(rid)
            while len(self._contexts) > MAX_OPEN_CONTEXTS:
                self._contexts.popitem(last=False)
        return ctx

    def take_context(self, request_id: int) -> RequestContext:
        """The context bound for request_id (removed), or the empty one (no middleware, or evicted)."""
        with self._lock:
            return self._contexts.pop(request_id, RequestContext())

    def next_step_id(self) -> int:
        with self._lock:
            self._step_id += 1
            if (self._gpu_uuids or self.engine_name != self.ring_name) and time.monotonic_ns() >= self._gpus_due_ns:
                self._write_gpus_locked()
            return self._step_id

    def close(self) -> None:
        """Unmap and remove the ring (only in the process that created it)."""
        with self._lock:
            producer, self._producer, self._quiet = self._producer, None, True
        if producer is not None and os.getpid() == self.pid:
            producer.close()
            producer.unlink()


_WRITERS: dict[int, VllmRingWriter] = {}  # pid -> this process's writer (see the module docstring)
_WRITERS_LOCK = threading.Lock()


def process_writer() -> VllmRingWriter:
    """This process's writer, created (settings from os.environ) on first use."""
    pid = os.getpid()
    with _WRITERS_LOCK:
        writer = _WRITERS.get(pid)
        if writer is None:
            writer = _WRITERS[pid] = VllmRingWriter(VllmProbeSettings.from_env(os.environ, pid))
        return writer
