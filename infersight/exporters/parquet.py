"""Per-request rows to a Parquet file, one row group per flush (pyarrow's streaming writer)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from infersight.agent.report import REQUEST_FIELDS

_TYPES = {"request_id": pa.int64(), "trace_id": pa.string(), "task": pa.string(), "prompt_tokens": pa.int64(),
          "cached_tokens": pa.int64(), "output_tokens": pa.int64(), "finish_reason": pa.string(),
          "num_preemptions": pa.int64(), "slow_cause": pa.string()}
SCHEMA = pa.schema([(name, _TYPES.get(name, pa.float64())) for name in REQUEST_FIELDS])


class ParquetSink:
    """Columns: REQUEST_FIELDS (seconds as float64). e2e_s = queue_s + prefill_s + preemption_stall_s
    + decode_s + network_s for every row."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer: pq.ParquetWriter | None = None
        self.rows_written = 0

    def write(self, rows: list[dict[str, object]]) -> None:
        if not rows:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, SCHEMA)
        columns = {name: [r.get(name) for r in rows] for name in REQUEST_FIELDS}
        self._writer.write_table(pa.table(columns, schema=SCHEMA))
        self.rows_written += len(rows)

    def close(self) -> None:
        if self._writer is None:
            if not self.rows_written:  # an empty file with the schema, so readers always find the columns
                pq.write_table(SCHEMA.empty_table(), self.path)  # (never over rows already written)
        else:
            self._writer.close()
            self._writer = None
