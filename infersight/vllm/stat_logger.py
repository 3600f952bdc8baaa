"""InfersightStatLogger: vLLM's stat-logger plugin that writes each engine step as probe records.

Registered under the entry-point group ``vllm.stat_logger_plugins`` (pyproject.toml), so
installing infersight into vLLM's environment is enough: vLLM's AsyncLLM finds it, turns stats on
(also under ``--disable-log-stats``), and builds one logger per engine (data-parallel rank) in the
API-server process. Every ``record()`` call then gets that step's ``SchedulerStats`` and
``IterationStats``, and the logger writes the following into the process's ring (writer.py):
- a STEP record;
- one SPEC record per draft (speculative decoding);
- for each request that finished in the step, its whole lifecycle (ARRIVED ... FINISHED, PREFIX),
  rebuilt from ``FinishedRequestStats`` (translate.py says how, and what is approximate).

The request id is ``key_for_vllm_id(FinishedRequestStats.request_id)``, the same key the
middleware gives the request's SERVED / NETWORK records; the trace and task the middleware saw are
taken from the writer. This is the only module here that imports vLLM.
"""
from __future__ import annotations

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

from infersight.vllm.ids import key_for_vllm_id
from infersight.vllm.translate import (
    Clock, KvGeometry, Record, request_records, spec_records, step_record, step_window,
)
from infersight.vllm.writer import VllmRingWriter, process_writer


class InfersightStatLogger(StatLoggerBase):
    """One per engine index; all of a process's loggers share its ring (and its step ids)."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self.vllm_config = vllm_config
        self.engine_index = engine_index
        self.writer: VllmRingWriter = process_writer()
        # A data-parallel rank above 0 (an API server per rank) is in the engine's name on the ring.
        parallel = getattr(vllm_config, "parallel_config", None)
        self.writer.set_data_parallel_rank(int(getattr(parallel, "data_parallel_rank", 0) or 0))
        cache = getattr(vllm_config, "cache_config", None)
        self.block_size = int(getattr(cache, "block_size", 0) or 0)
        self.prefix_caching = bool(getattr(cache, "enable_prefix_caching", False))
        self._previous_end_ns: int | None = None  # None: idle since the last step (or none yet)

    def _kv(self) -> KvGeometry:
        # num_gpu_blocks is filled in after the engine core's KV profiling; vLLM keeps one block aside.
        blocks = getattr(getattr(self.vllm_config, "cache_config", None), "num_gpu_blocks", None) or 0
        return KvGeometry(max(0, int(blocks) - 1), self.block_size)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
               mm_cache_stats: MultiModalCacheStats | None = None, engine_idx: int = 0) -> None:
        """Called by vLLM after each batch of engine-core outputs; never raises."""
        try:
            self.writer.write_records(self.translate(scheduler_stats, iteration_stats))
        except Exception as exc:  # noqa: BLE001 -- a logger must not break vLLM's output loop
            self.writer.fail("translating vLLM stats", exc)

    def translate(self, sched: SchedulerStats | None, it: IterationStats | None) -> list[Record]:
        """This call's records (also usable without a ring, e.g. to inspect them)."""
        if sched is None and it is None:
            return []
        clock = Clock.now()
        end = clock.mono(it.iteration_timestamp) if it is not None else clock.mono_ns
        start, end = step_window(end, self._previous_end_ns, sched)
        records = [step_record(self.writer.next_step_id(), start, end, sched, it, self._kv())]
        busy = sched is None or sched.num_running_reqs + sched.num_waiting_reqs + sched.num_skipped_waiting_reqs > 0
        self._previous_end_ns = end if busy else None
        if sched is not None and sched.spec_decoding_stats is not None:
            records += spec_records(end, sched.spec_decoding_stats)
        for fin in it.finished_requests if it is not None else ():
            if fin.request_id is None:
                continue  # vLLM leaves it unset only outside the OpenAI server; nothing to join on
            key = key_for_vllm_id(fin.request_id)
            records += request_records(fin, key, end, self.writer.take_context(key), self.prefix_caching)
        return records

    def log_engine_initialized(self) -> None:
        """The engine is up: create the ring now, so an agent sees it before the first request."""
        try:
            self.writer.open()
        except Exception as exc:  # noqa: BLE001
            self.writer.fail("opening the probe ring", exc)

    def log(self) -> None:
        """vLLM's periodic log hook: every record is already written."""
