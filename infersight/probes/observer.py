"""ProbeObserver: the engine's observer that writes each transition as a fixed-size record.

Every callback packs one struct and hands the bytes to the ring, except a step's TOKENS events,
STEP, STEP_TIMING and batch members, which go out as one block of slots at the step's end, the
TOKENS and members many to a slot (probes.step_block, probes.record_batches; readers see them as
REQUEST and BATCH_MEMBER records); the ring never blocks and counts what it drops. Nothing here
aggregates: that is the sidecar's job, outside the loop.
Nothing here raises into the engine for a value: one that does not fit its field is coerced and
counted (probes.record_encoding; ``encode_fixes``), the fast C pack being tried first.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from infersight.probes.capture import StepCapture
from infersight.probes.config import ProbeConfig, TaskLabels
from infersight.probes.control import ControlBlock, control_name
from infersight.probes.gpu_uuids import visible_gpu_uuids
from infersight.probes.host_pauses import HostPauses
from infersight.probes.policy_block import acknowledge, read_policy, read_seq, set_configured_max_num_seqs
from infersight.probes.record_encoding import PACK_ERRORS
from infersight.probes.nvtx import NvtxRanges
from infersight.probes.records import (
    MOE_EXPERTS_PER_RECORD, FinishReason, PreemptReason, RecordKind, RequestEvent, record_dtype, record_registry,
    record_struct, split_trace_id,
)
from infersight.probes.records import (
    EP_EXPERTS_PER_RECORD, EP_PEERS_PER_RECORD, GPU_RECORD_EVERY_S, engine_name_bytes,
)
from infersight.probes.ring import RingProducer
from infersight.probes.step_block import StepBlock, step_values, timing_values
from infersight.runtime.model.model_config import ModelConfig
from infersight.runtime.engine.run_policy import RunPolicy
from infersight.runtime.observer import EngineObserver, KVBlockEvent
from infersight.runtime.ranges import RangeMarker
from infersight.runtime.stats import StepStats

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
_PREEMPT = {"recompute": PreemptReason.RECOMPUTE, "swap": PreemptReason.SWAP}
_UNKNOWN_REQUEST = (0, 0, 0)


class ProbeObserver(EngineObserver):
    def __init__(self, config: ProbeConfig | None = None) -> None:
        self.config = config = config if config is not None else ProbeConfig()
        self.ranges: RangeMarker = (NvtxRanges(use_record_function=config.record_function)
                                    if config.nvtx else RangeMarker())
        self.wants_expert_counts = config.expert_counts
        self.ring = RingProducer.create(config.ring_name, config.ring_capacity, None, record_registry())
        self.control = ControlBlock(control_name(config.ring_name), create=True)
        self.capture = StepCapture(self.control, config.capture_dir)
        self._policy_seq = 0  # the run-time policy last handed to the engine (probes.policy_block)
        self.tasks = TaskLabels(config.task_labels, config.max_task_labels)
        self._requests: dict[int, tuple[int, int, int]] = {}  # request id -> (trace hi, trace lo, task id)
        self._pending_counts: tuple[int, torch.Tensor, torch.cuda.Event] | None = None
        self._pinned: list[torch.Tensor] | None = None
        self._copied: list[torch.cuda.Event] = []  # one per pinned buffer: its copy done
        self._flip = 0
        self._moe_rows: tuple[np.ndarray, np.ndarray] | None = None  # a step's MOE records and counts (_write_moe)
        self._ring_write = self.ring.write
        # TOKENS records wait for the step's one block write; any other record flushes them first
        # (ring order kept). The step's own records go out in the same block (probes.step_block).
        self._block = StepBlock(self.ring)
        self._pending_tokens = self._block.pending
        self._add_tokens = self._pending_tokens.extend  # flat: t_ns, request_id, num_tokens
        self._hold_tokens = self._block.hold
        self._write_step = self._block.write_step
        self._structs = {kind: record_struct(kind) for kind in RecordKind}
        self._pack = {kind: s.fast_pack for kind, s in self._structs.items()}  # raise PACK_ERRORS
        self._safe = {kind: s.pack for kind, s in self._structs.items()}  # coerce and count
        # The GPUs this engine uses, for a sidecar that cannot see them (it reads dcgm-exporter by UUID).
        self.gpu_uuids = tuple(config.gpu_uuids) if config.gpu_uuids is not None else visible_gpu_uuids()
        self._gpus_due_ns = 0
        # The engine's name, announced only where it is not the ring's (the agent's default for it).
        self.engine_name = config.engine_name if config.engine_name != self.ring.name else None
        self._write_gpus()
        # Timed from here on, taken on this (the producer's) thread: probes.host_pauses.
        self.host_pauses = HostPauses(config.host_pause_min_s) if config.host_pause_min_s is not None else None

    @property
    def decode_graphs_while_profiling(self) -> bool:  # type: ignore[override]
        """True during a capture window that asked for graph replays (StepCapture.decode_graphs)."""
        return self.capture.decode_graphs

    @property
    def ring_name(self) -> str:
        return self.ring.name

    def _write(self, kind: RecordKind, data: bytes) -> bool:
        if self._pending_tokens or self._block.held_ids:
            self._flush_tokens()
        return self._ring_write(kind, data)

    def _flush_tokens(self) -> None:
        """The held TOKENS records, as one block; when a value does not fit, record by record, coerced.
        One alone (another record flushing each, as a SPEC per verified request does) goes as its
        REQUEST record: a batch of one costs the reader an unbatching for nothing."""
        if self._block.held == 1:
            ((t, rid, n),) = self._block.take_pending()
            self._req(rid, t, 0, n, 0, RequestEvent.TOKENS, 0)
            return
        if not self._block.write_tokens():
            for t, rid, n in self._block.take_pending():
                self._req(rid, t, 0, n, 0, RequestEvent.TOKENS, 0)

    @property
    def encode_fixes(self) -> dict[str, int]:
        """Fields coerced to fit their record ("KIND field: reason" -> count); empty when all fit."""
        return {f"{kind.name} {key}": n for kind, s in self._structs.items() for key, n in s.fixes.items()}

    def _put(self, kind: RecordKind, *values: object) -> None:
        try:
            data = self._pack[kind](*values)
        except PACK_ERRORS:
            data = self._safe[kind](*values)
        self._write(kind, data)

    def _req(self, rid: int, ts: int, end: int, v0: int, v1: int, event: RequestEvent, reason: int) -> None:
        hi, lo, task = self._requests.get(rid, _UNKNOWN_REQUEST)
        try:  # inline, not _put: the hottest record
            data = self._pack[RecordKind.REQUEST](ts, end, rid, hi, lo, v0, v1, task, event, reason)
        except PACK_ERRORS:
            data = self._safe[RecordKind.REQUEST](ts, end, rid, hi, lo, v0, v1, task, event, reason)
        self._write(RecordKind.REQUEST, data)

    # -- requests ---------------------------------------------------------------------------
    def on_request_arrived(self, request_id: int, t_ns: int, num_prompt_tokens: int,
                           task: str | None, trace_id: int) -> None:
        task_id, new = self.tasks.intern(task)
        if new:  # a str label: the coercing pack encodes it (unencodable characters replaced, counted)
            self._write(RecordKind.TASK_LABEL, self._safe[RecordKind.TASK_LABEL](task_id, task or b""))
        self._requests[request_id] = meta = (*split_trace_id(trace_id), task_id)
        self._block.add_request(request_id, *meta)
        self._req(request_id, t_ns, 0, num_prompt_tokens, 0, RequestEvent.ARRIVED, 0)

    def on_request_scheduled(self, request_id: int, t_ns: int, num_prompt_tokens: int,
                             num_cached_tokens: int, prefix_group_hash: int) -> None:
        self._req(request_id, t_ns, 0, num_prompt_tokens, num_cached_tokens, RequestEvent.SCHEDULED, 0)
        task_id = self._requests.get(request_id, _UNKNOWN_REQUEST)[2]
        self._put(RecordKind.PREFIX, t_ns, request_id, prefix_group_hash, num_prompt_tokens, num_cached_tokens,
                  task_id)

    def on_prefill_chunk(self, request_id: int, start_ns: int, end_ns: int, start_pos: int,
                         num_tokens: int) -> None:
        self._req(request_id, start_ns, end_ns, num_tokens, start_pos, RequestEvent.PREFILL_CHUNK, 0)

    def on_first_token(self, request_id: int, t_ns: int) -> None:
        self._req(request_id, t_ns, 0, 0, 0, RequestEvent.FIRST_TOKEN, 0)

    def on_tokens_emitted(self, request_id: int, t_ns: int, num_tokens: int) -> None:
        if self._block.held_ids:
            self._block.flatten()
        self._add_tokens((t_ns, request_id, num_tokens))  # written by the next record or the step's end

    def on_tokens_emitted_many(self, request_ids: list[int], t_ns: int, num_tokens: list[int]) -> None:
        self._hold_tokens(t_ns, request_ids, num_tokens)  # as they are: the step's block fills the rows

    def on_request_preempted(self, request_id: int, t_ns: int, reason: str) -> None:
        self._req(request_id, t_ns, 0, 0, 0, RequestEvent.PREEMPTED, _PREEMPT.get(reason, 0))

    def on_request_resumed(self, request_id: int, t_ns: int) -> None:
        self._req(request_id, t_ns, 0, 0, 0, RequestEvent.RESUMED, 0)

    def on_request_finished(self, request_id: int, t_ns: int, reason: str, num_output_tokens: int) -> None:
        if self.host_pauses:  # the request's own pauses before its end
            self._write_host_pauses()
        self._req(request_id, t_ns, 0, num_output_tokens, 0, RequestEvent.FINISHED,
                  _FINISH.get(reason, FinishReason.OTHER))
        self._requests.pop(request_id, None)
        self._block.drop_request(request_id)

    def on_network(self, request_id: int, receive_ns: int, first_byte_ns: int, last_byte_ns: int) -> None:
        """The HTTP server's timing of a request (monotonic ns): body received, first and last
        response byte sent. Not an engine callback: `infersight serve` calls it from its engine
        thread (the ring's one producer) after the last byte, so it follows the FINISHED event."""
        self._put(RecordKind.NETWORK, request_id, receive_ns, first_byte_ns, last_byte_ns)

    # -- the run-time policy the agent sets in the control block (probes.policy_block) -------------
    def policy_update(self) -> RunPolicy | None:  # type: ignore[override]
        """The agent's policy when its seq moved since the last call (acknowledged), else None: one
        8-byte read a step. A table torn by a write in progress is read again at the next step."""
        buf = self.control.shm.buf
        if read_seq(buf) == self._policy_seq:
            return None
        policy = read_policy(buf)
        if policy is None:
            return None
        self._policy_seq = policy.seq
        acknowledge(buf, policy.seq)
        return policy

    def on_policy_limits(self, max_num_seqs: int) -> None:
        set_configured_max_num_seqs(self.control.shm.buf, max_num_seqs)

    def on_policy_arm(self, request_id: int, t_ns: int, arm: int, policy_seq: int) -> None:
        self._req(request_id, t_ns, 0, arm, policy_seq, RequestEvent.POLICY_ARM, 0)

    # -- KV, MoE, speculation, steps ----------------------------------------------------------
    def on_kv_block(self, event: KVBlockEvent, block_id: int, request_id: int, block_hash: int) -> None:
        self._put(RecordKind.KV_BLOCK, time.monotonic_ns(), request_id, block_hash, block_id, event)

    def on_expert_counts(self, step_id: int, counts: torch.Tensor) -> None:
        if not counts.is_cuda:  # the CPU's, or an async step's (on the host already: AsyncSteps)
            self.flush()  # a synchronous step's counts before, in step order (its copy is long done)
            self._write_moe(step_id, counts.numpy())
            return
        # Copy to pinned memory behind the step's work; read it one step later, when the copy
        # has long finished, so the engine never waits for the device here.
        # Two pinned buffers, alternating: pinned allocation is slow, and the buffer written one
        # step ago is still being read by flush() below.
        # Their events are reused too: a buffer's event was waited for (flush) before it is recorded again.
        if self._pinned is None or self._pinned[0].shape != counts.shape:
            self._pinned = [torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True) for _ in range(2)]
            self._copied = [torch.cuda.Event() for _ in range(2)]
        self._flip ^= 1
        buf, event = self._pinned[self._flip], self._copied[self._flip]
        buf.copy_(counts, non_blocking=True)
        event.record()
        self.flush()
        self._pending_counts = (step_id, buf, event)

    def _write_moe(self, step_id: int, counts: np.ndarray) -> None:
        """One MOE record per (layer, chunk of MOE_EXPERTS_PER_RECORD experts), in one ring write. A record
        at a time took 599 us a step for 61 layers x 256 experts on the CPU (30 us now), and on an H100 host
        was the largest piece of the expert counts' cost after the torch calls (benchmarks/moe_record_write.py,
        observer_step.py --profile). Values a record cannot hold go record by record, coerced."""
        n_layers, n_experts = counts.shape
        per = MOE_EXPERTS_PER_RECORD
        chunks = -(-n_experts // per)
        if not (0 <= step_id < 2**64 and n_layers <= 2**16 and n_experts < 2**16
                and (counts.size == 0 or 0 <= counts.min() and counts.max() <= 0xFFFFFFFF)):
            for layer in range(n_layers):
                for off in range(0, n_experts, per):
                    chunk = counts[layer, off:off + per].tolist()
                    self._put(RecordKind.MOE, step_id, layer, off, n_experts, *chunk, *[0] * (per - len(chunk)))
            return
        if self._moe_rows is None or self._moe_rows[1].shape != (n_layers, chunks * per):
            rows = np.zeros(n_layers * chunks, dtype=record_dtype(RecordKind.MOE))
            rows["layer"] = np.repeat(np.arange(n_layers), chunks)
            rows["expert_offset"] = np.tile(np.arange(chunks) * per, n_layers)
            self._moe_rows = (rows, np.zeros((n_layers, chunks * per), dtype=np.uint32))
        rows, wide = self._moe_rows
        rows["step_id"], rows["n_experts"] = step_id, n_experts
        wide[:, :n_experts] = counts
        wide[:, n_experts:] = 0  # a step before may have had more experts in the same chunks
        rows["counts"] = wide.reshape(n_layers * chunks, per)
        if self._pending_tokens or self._block.held_ids:  # ring order, as _write keeps it
            self._flush_tokens()
        self.ring.write_many(RecordKind.MOE, rows)

    def flush(self) -> None:
        """Write expert counts still waiting for their device copy."""
        if self._pending_counts is not None:
            step_id, buf, event = self._pending_counts
            self._pending_counts = None
            event.synchronize()
            self._write_moe(step_id, buf.numpy())

    def on_ep_stats(self, step_id: int, layer: int, rank: int, world: int, dispatch_ns: int, combine_ns: int,
                    compute_ns: int, bytes_to_peer: Sequence[int], tokens_per_local_expert: Sequence[int],
                    local_expert_ids: Sequence[int], gather_ns: int = 0, total_ns: int = 0) -> None:
        """One MoE layer's expert-parallel stats on this rank (see runtime.parallel.stats.EPLayerStats).
        Not an EngineObserver callback: ExpertParallelEngine calls it after each step. Peers and
        local experts beyond one record's width spill into further records (chunk 1, 2, ...)."""
        put = self._put
        peers, slots = EP_PEERS_PER_RECORD, EP_EXPERTS_PER_RECORD
        n_slots = len(tokens_per_local_expert)
        for chunk in range(max(1, -(-world // peers), -(-n_slots // slots))):
            sent = list(bytes_to_peer[chunk * peers:(chunk + 1) * peers])
            ids = list(local_expert_ids[chunk * slots:(chunk + 1) * slots])
            tokens = list(tokens_per_local_expert[chunk * slots:(chunk + 1) * slots])
            put(RecordKind.EP_STATS,
                step_id, layer, rank, world, chunk, n_slots, dispatch_ns, combine_ns, compute_ns, gather_ns,
                total_ns, *sent, *[0] * (peers - len(sent)), *ids, *[0] * (slots - len(ids)),
                *tokens, *[0] * (slots - len(tokens)))

    def on_spec_verified(self, request_id: int, num_proposed: int, num_accepted: int,
                         accept_mask: list[bool], draft_ns: int, verify_ns: int) -> None:
        mask = 0
        for i, ok in enumerate(accept_mask[:64]):
            mask |= int(ok) << i
        task_id = self._requests.get(request_id, _UNKNOWN_REQUEST)[2]
        self._put(RecordKind.SPEC, time.monotonic_ns(), request_id, draft_ns, verify_ns, mask, task_id, num_proposed,
                  num_accepted)

    def on_model(self, model: ModelConfig, dtype_bytes: int) -> None:
        self.capture.on_model(model, dtype_bytes)

    def on_step_begin(self, step_id: int, t_ns: int) -> None:
        self.capture.on_step_begin(step_id)

    def on_step_end(self, stats: StepStats) -> None:
        if not self._write_step(stats):  # a value that does not fit: record by record, coerced
            self._write_step_records(stats)
        if (self.gpu_uuids or self.engine_name) and stats.end_ns >= self._gpus_due_ns:
            self._write_gpus()
        if self.host_pauses:
            self._write_host_pauses()
        self.capture.on_step_end(stats)

    def _write_host_pauses(self) -> None:
        """The garbage collections timed since the last call, one HOST_PAUSE record each; the first
        carries how many were pushed out of the held ones before it."""
        pauses, missed = self.host_pauses.take()  # type: ignore[union-attr]
        for start, end, collected, generation in pauses:
            self._put(RecordKind.HOST_PAUSE, start, end, collected, missed, generation)
            missed = 0

    def _write_gpus(self) -> None:
        """The engine's name (ENGINE, where it has one of its own) and one GPU record per GPU, again
        every GPU_RECORD_EVERY_S (an agent attaching late learns them)."""
        now = time.monotonic_ns()
        if self.engine_name:
            self._put(RecordKind.ENGINE, now, engine_name_bytes(self.engine_name))
        for index, uuid in enumerate(self.gpu_uuids):
            self._put(RecordKind.GPU, now, index, uuid.encode())
        self._gpus_due_ns = now + int(GPU_RECORD_EVERY_S * 1e9)

    def _write_step_records(self, stats: StepStats) -> None:
        """The step's records one `write` each in the per-record kinds (held TOKENS first), every
        value coerced to fit and counted."""
        self._flush_tokens()
        self._put(RecordKind.STEP, *step_values(stats), len(stats.batch), len(stats.finished))
        self._put(RecordKind.STEP_TIMING, *timing_values(stats))
        for rid, tokens in stats.batch:
            self._put(RecordKind.BATCH_MEMBER, stats.step_id, rid, tokens)

    def warm_profiler(self) -> float:
        """The capture side's profiler started and stopped once before serving (StepCapture.warm_up);
        returns its seconds."""
        return self.capture.warm_up()

    def close(self, unlink: bool = True) -> None:
        if self.host_pauses is not None:
            self.host_pauses.close()
        self.flush()
        self._flush_tokens()
        self.capture.close()
        self.control.close()
        self.ring.close()
        if unlink:
            self.ring.unlink()


def make_observer(config: ProbeConfig | None) -> EngineObserver:
    """None: probes off. events=False: NVTX ranges only. Otherwise the full ProbeObserver."""
    if config is None:
        return EngineObserver()
    if not config.events:
        observer = EngineObserver()
        observer.ranges = NvtxRanges(use_record_function=config.record_function) if config.nvtx else RangeMarker()
        return observer
    return ProbeObserver(config)
