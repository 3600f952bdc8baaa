"""Per-request rows to a Parquet file, one row group per flush (pyarrow's streaming writer)."""
from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from infersight.correlate.requests import REQUEST_FIELDS

if TYPE_CHECKING:
    import pandas as pd

    from infersight.correlate.frames import EventFrames

_TYPES = {"request_id": pa.int64(), "trace_id": pa.string(), "task": pa.string(), "prompt_tokens": pa.int64(),
          "cached_tokens": pa.int64(), "output_tokens": pa.int64(), "finish_reason": pa.string(),
          "num_preemptions": pa.int64(), "slow_cause": pa.string()}
#: Column docs kept in the file (field metadata "doc"), for the figures that are not plain measurements.
COLUMN_DOCS = {
    "engine_seconds": "modelled: the request's token share of its engine steps' wall-clock time (host work included)",
    "energy_j": "modelled split of measured energy: the GPU total-energy counter over each engine step (measured, "
                "interpolated between the sampler's readings), split over the step's requests by modelled cost "
                "(joules per prefill, decode and draft token, fitted on the counter's measured intervals; "
                "infersight.correlate.token_cost). Null "
                "without a GPU energy counter",
    "energy_dynamic_j": "modelled split of measured energy: the part of energy_j the fitted model puts on the "
                        "request's tokens (each step's energy cut into dynamic and static in the model's "
                        "proportion: tokens x dynamic joules per token against static watts x step time); null "
                        "where a step of it was split before the fit was usable",
    "energy_static_j": "modelled split of measured energy: energy_j - energy_dynamic_j, the request's share of the "
                       "GPU's static draw in its steps (shared in proportion to the members' dynamic cost)",
    "energy_sampling_bound_j": "the most the energy counter's sampling interval can have moved into or out of "
                               "energy_j (power anywhere between 0 W and the most seen; "
                               "infersight.correlate.sampling_bound); the split model's own error is not in it",
    "gpu_sm_active_s": "modelled split of measured SM activity x step time, split as energy_j is",
}
SCHEMA = pa.schema([pa.field(name, _TYPES.get(name, pa.float64()),
                             metadata={"doc": COLUMN_DOCS[name]} if name in COLUMN_DOCS else None)
                    for name in REQUEST_FIELDS])


class ParquetSink:
    """Columns: REQUEST_FIELDS (seconds as float64). e2e_s = queue_s + prefill_s + preemption_stall_s
    + decode_s + network_s for every row. Modelled columns carry their doc (COLUMN_DOCS) in the
    schema's field metadata.

    Rows are buffered into row groups of `rows_per_group` rows, or of what `flush_s` seconds brought,
    whichever comes first. Written as they came (a row group per agent poll, a few rows each), a
    30-minute soak's file held 10,430 row groups for 20,550 rows: a 26 MB footer, and the writer keeps
    every row group's metadata in memory until it closes: the agent grew ~67 MB per 10 minutes
    (BENCHMARKS.md). A poll's rows become one Arrow table at once (not kept as dicts), and every
    `compact_every` tables are joined, so the buffer costs its rows, not its polls."""

    def __init__(self, path: str | Path, rows_per_group: int = 10_000, flush_s: float = 300.0,
                 compact_every: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        if rows_per_group < 1 or compact_every < 1 or not flush_s >= 0:
            raise ValueError("rows_per_group and compact_every must be >= 1 and flush_s >= 0")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows_per_group, self.flush_s, self.compact_every = rows_per_group, flush_s, compact_every
        self._clock = clock
        self._writer: pq.ParquetWriter | None = None
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._since = 0.0  # when the buffer got its first rows
        self.rows_written = 0  # rows handed to write() (written by close() at the latest)
        self.row_groups = 0

    @property
    def buffered(self) -> tuple[int, int]:
        """(tables, rows) waiting for their row group."""
        return len(self._buffer), self._buffered_rows

    def write(self, rows: list[dict[str, object]]) -> None:
        if not rows:
            return
        if not self._buffer:
            self._since = self._clock()
        columns = {name: [r.get(name) for r in rows] for name in REQUEST_FIELDS}
        self._buffer.append(pa.table(columns, schema=SCHEMA))
        self._buffered_rows += len(rows)
        self.rows_written += len(rows)
        if len(self._buffer) >= self.compact_every:
            self._buffer = [pa.concat_tables(self._buffer).combine_chunks()]
        if self._buffered_rows >= self.rows_per_group or self._clock() - self._since >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group (none when nothing is buffered)."""
        if not self._buffer:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, SCHEMA)
        self._writer.write_table(pa.concat_tables(self._buffer), row_group_size=max(self._buffered_rows, 1))
        self._buffer, self._buffered_rows = [], 0
        self.row_groups += 1

    def close(self) -> None:
        self.flush()
        if self._writer is None:
            if not self.rows_written:  # an empty file with the schema, so readers always find the columns
                pq.write_table(SCHEMA.empty_table(), self.path)  # (never over rows already written)
        else:
            self._writer.close()
            self._writer = None


class FrameSink:
    """Every decoded event stream to its own Parquet file (<dir>/<frame>.parquet), with the columns
    documented in infersight.correlate.frames. Batches are buffered into row groups of about
    `rows_per_group` rows (one row group per poll would bloat the file), or of what `flush_s` seconds
    brought, whichever comes first. The report reads these.

    Memory: a poll's batch of a sparse stream is a few rows, and an Arrow table costs ~9 KB whatever
    its rows; buffered one per poll, 50,000 rows of such a stream were 30,000 tables, 256 MB (an agent
    with --parquet-dir grew ~40 MB a minute beside a CPU `serve`, BENCHMARKS.md). Every `compact_every`
    batches are joined into one table, so a buffer costs its rows, not its polls."""

    def __init__(self, directory: str | Path, rows_per_group: int = 50_000, flush_s: float = 300.0,
                 compact_every: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rows_per_group = rows_per_group
        self.flush_s = flush_s
        self.compact_every = compact_every
        self._clock = clock
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._buffers: dict[str, list[pa.Table]] = {}
        self._since: dict[str, float] = {}  # when each stream's buffer got its first batch

    def buffered(self, name: str) -> tuple[int, int]:
        """(tables, rows) of one stream waiting for its row group."""
        buf = self._buffers.get(name, [])
        return len(buf), sum(t.num_rows for t in buf)

    def write(self, frames: "EventFrames") -> None:
        for f in fields(frames):
            self.write_table(f.name, getattr(frames, f.name))

    def write_table(self, name: str, df: "pd.DataFrame") -> None:
        """Rows of one stream, to <dir>/<name>.parquet (GPU samples go to gpu.parquet this way)."""
        if df.empty:
            return
        buf = self._buffers.setdefault(name, [])
        if not buf:
            self._since[name] = self._clock()
        # Name columns decoded as Categoricals (correlate.frames) are written as the strings they
        # hold: every file keeps one plain schema, whatever the poll's categories were.
        names = {c: "str" for c, t in df.dtypes.items() if getattr(t, "name", "") == "category"}
        buf.append(pa.Table.from_pandas(df.astype(names) if names else df, preserve_index=False))
        if len(buf) >= self.compact_every:
            try:  # a column all null in some polls is typed null there: promote, as the writer's cast does
                buf[:] = [pa.concat_tables(buf, promote_options="default").combine_chunks()]
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                self._flush(name)  # the writer casts each batch to the file's schema (or says why not)
                return
        if sum(t.num_rows for t in buf) >= self.rows_per_group or self._clock() - self._since[name] >= self.flush_s:
            self._flush(name)

    def _flush(self, name: str) -> None:
        buf = self._buffers.pop(name, [])
        if not buf:
            return
        writer = self._writers.get(name)
        if writer is None:
            writer = self._writers[name] = pq.ParquetWriter(self.directory / f"{name}.parquet", buf[0].schema)
        writer.write_table(pa.concat_tables([t.cast(writer.schema) for t in buf]))

    def close(self) -> None:
        for name in list(self._buffers):
            self._flush(name)
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
