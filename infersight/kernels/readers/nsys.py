"""Nsight Systems SQLite export (`nsys export --type sqlite`) -> KernelTrace.

Tables read, each only when present and only through the columns it has (the schema changes
between nsys versions):
- CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, correlationId, grid*/block*,
  demangledName / shortName as StringIds ids), _MEMCPY (bytes, copyKind), _MEMSET (bytes);
- CUPTI_ACTIVITY_KIND_RUNTIME (start, end, globalTid, correlationId, nameId or name). nsys records
  some calls twice under one correlationId (e.g. cudaLaunchKernel and cudaLaunchKernel_v7000,
  one inside the other); the outermost row is kept and the "_vNNNN" suffix dropped;
- NVTX_EVENTS (start, end, eventType, text or textId, globalTid, domainId, payload columns);
  event types by name from ENUM_NSYS_EVENT_TYPE when the export has it, else nsys's fixed ids;
- ENUM_CUDA_MEMCPY_OPER for copy directions; META_DATA_EXPORT or (older) EXPORT_META_DATA and
  TARGET_INFO_GPU for what the export says about itself.

Attribution: a kernel's launch is the runtime row with its correlationId; the NVTX push/pop
ranges open on that thread at the launch's start give its range_path. Start/end ranges do not
nest (they may even end on another thread), so they are listed in `ranges` (kind "startend",
depth 0) but not used for paths. A push without a pop (end NULL) is dropped.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd

from infersight.kernels.frames import (
    KERNEL_COLUMNS, RANGE_COLUMNS, RUNTIME_COLUMNS, KernelTrace, TraceError, typed_frame,
)
from infersight.kernels.readers.input_files import MAX_FILE_BYTES, check_regular_file
from infersight.kernels.readers.ranges import HELPER_COLUMNS, enclosing_range, nest_ranges

# nsys event type ids, used only when the export lacks ENUM_NSYS_EVENT_TYPE (older schemas).
_FALLBACK_EVENT_TYPES = {"NvtxPushPopRange": 59, "NvtxtPushPopRange": 70, "NvtxStartEndRange": 60,
                         "NvtxtStartEndRange": 71, "NvtxDomainCreate": 75}
# CUPTI's CUpti_ActivityMemcpyKind, used only when ENUM_CUDA_MEMCPY_OPER is absent.
_FALLBACK_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
                        8: "DtoD", 9: "HtoH", 10: "PtoP"}
_PAYLOAD_COLUMNS = ("int64Value", "uint64Value", "int32Value", "uint32Value")
_VERSION_SUFFIX = re.compile(r"_v\d+$")


def _connect(path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
        conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a readable SQLite database ({exc})") from None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}


def _enum(conn: sqlite3.Connection, tables: set[str], table: str) -> pd.DataFrame | None:
    if table not in tables or not {"id", "name"} <= _columns(conn, table):
        return None
    return pd.read_sql_query(f'SELECT * FROM "{table}"', conn)


def export_metadata(conn: sqlite3.Connection, tables: set[str]) -> dict[str, str]:
    """name -> value from META_DATA_EXPORT (newer exports) or EXPORT_META_DATA (older ones)."""
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables and {"name", "value"} <= _columns(conn, table):
            return {str(k): str(v) for k, v in conn.execute(f'SELECT name, value FROM "{table}"')}
    return {}


class _Strings:
    """StringIds lookups: a name column may hold an id (int) or, in some schemas, the text."""

    def __init__(self, conn: sqlite3.Connection, tables: set[str]) -> None:
        self.table: dict[int, str] = {}
        if "StringIds" in tables:
            self.table = {int(i): str(v) for i, v in conn.execute("SELECT id, value FROM StringIds")}

    def resolve(self, values: pd.Series) -> np.ndarray:
        """Text per value: ids (ints, or floats when the column had NULLs) looked up, NULL -> ""."""
        out = []
        for v in values:
            if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
                out.append("")
            elif isinstance(v, (int, np.integer)) or (isinstance(v, float) and v.is_integer()):
                out.append(self.table.get(int(v), str(int(v))))
            else:
                out.append(str(v))
        return np.array(out, dtype=object)


def _gpu_frame(conn: sqlite3.Connection, tables: set[str], strings: _Strings) -> tuple[pd.DataFrame, np.ndarray]:
    """The kernels frame (paths not yet filled) and each row's process id (-1 unknown): CUDA
    correlation ids are per process, so launches are matched on (process, correlation)."""
    parts: list[pd.DataFrame] = []
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        cols = _columns(conn, "CUPTI_ACTIVITY_KIND_KERNEL")
        name_col = next((c for c in ("demangledName", "shortName", "mangledName") if c in cols), None)
        dims = [c for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ") if c in cols]
        select = ", ".join(["start", "end", "deviceId", "streamId", "correlationId"] + dims +
                           ([name_col] if name_col else []) + (["globalPid"] if "globalPid" in cols else []))
        k = pd.read_sql_query(f"SELECT {select} FROM CUPTI_ACTIVITY_KIND_KERNEL", conn)
        grid = (k["gridX"].astype(str).radd("(") + "," + k["gridY"].astype(str) + "," + k["gridZ"].astype(str) + ")"
                if len(dims) == 6 else pd.Series([None] * len(k), dtype=object))
        block = (k["blockX"].astype(str).radd("(") + "," + k["blockY"].astype(str) + "," + k["blockZ"].astype(str) + ")"
                 if len(dims) == 6 else pd.Series([None] * len(k), dtype=object))
        names = strings.resolve(k[name_col]) if name_col else np.full(len(k), "", dtype=object)
        parts.append(k.assign(name=names, category="kernel", grid=grid.to_numpy(object),
                              block=block.to_numpy(object), bytes=0))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        pid = ", globalPid" if "globalPid" in _columns(conn, "CUPTI_ACTIVITY_KIND_MEMCPY") else ""
        m = pd.read_sql_query(f"SELECT start, end, deviceId, streamId, correlationId, bytes, copyKind{pid} "
                              "FROM CUPTI_ACTIVITY_KIND_MEMCPY", conn)
        kinds = dict(_FALLBACK_COPY_KINDS)
        enum = _enum(conn, tables, "ENUM_CUDA_MEMCPY_OPER")
        if enum is not None:
            label = "label" if "label" in enum.columns else "name"
            kinds = {int(i): str(v) for i, v in zip(enum["id"], enum[label])}
        names = ["Memcpy " + kinds.get(int(c), f"kind {int(c)}") for c in m["copyKind"].fillna(0)]
        parts.append(m.drop(columns="copyKind").assign(name=np.array(names, dtype=object), category="gpu_memcpy",
                                                       grid=None, block=None))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        pid = ", globalPid" if "globalPid" in _columns(conn, "CUPTI_ACTIVITY_KIND_MEMSET") else ""
        s = pd.read_sql_query(f"SELECT start, end, deviceId, streamId, correlationId, bytes{pid} "
                              "FROM CUPTI_ACTIVITY_KIND_MEMSET", conn)
        parts.append(s.assign(name="Memset", category="gpu_memset", grid=None, block=None))
    parts = [p for p in parts if len(p)]
    if not parts:
        return typed_frame({c: [] for c in KERNEL_COLUMNS}, KERNEL_COLUMNS), np.zeros(0, np.int64)
    g = pd.concat(parts, ignore_index=True)
    ts = g["start"].to_numpy(np.int64)
    gpid = g["globalPid"].fillna(-1).to_numpy(np.int64) if "globalPid" in g.columns else np.full(len(g), -1)
    process = np.where(gpid >= 0, _process_of(gpid), -1)
    return typed_frame({
        "ts_ns": ts, "dur_ns": np.maximum(g["end"].to_numpy(np.int64) - ts, 0), "name": g["name"].to_numpy(object),
        "category": g["category"].to_numpy(object), "device": g["deviceId"].fillna(-1).to_numpy(np.int64),
        "stream": g["streamId"].fillna(-1).to_numpy(np.int64),
        "correlation": g["correlationId"].fillna(-1).to_numpy(np.int64), "grid": g["grid"].to_numpy(object),
        "block": g["block"].to_numpy(object), "bytes": g["bytes"].fillna(0).to_numpy(np.int64),
        "range_path": "", "step_id": -1, "source": "nsys"}, KERNEL_COLUMNS), process


def _process_of(global_tid: np.ndarray) -> np.ndarray:
    """nsys packs the pid into bits 24..47 of a globalTid."""
    return (global_tid >> 24) & 0xFFFFFF


def _runtime_frame(conn: sqlite3.Connection, tables: set[str], strings: _Strings) -> pd.DataFrame:
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return typed_frame({c: [] for c in RUNTIME_COLUMNS}, RUNTIME_COLUMNS)
    cols = _columns(conn, "CUPTI_ACTIVITY_KIND_RUNTIME")
    name_col = "nameId" if "nameId" in cols else ("name" if "name" in cols else None)
    r = pd.read_sql_query("SELECT start, end, globalTid, correlationId" + (f", {name_col}" if name_col else "") +
                          " FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NOT NULL", conn)
    # Outermost row per (process, correlation id): earliest start, then longest.
    r = r.assign(_dur=r["end"] - r["start"], _pid=_process_of(r["globalTid"].fillna(-1).to_numpy(np.int64)))
    r = r.sort_values(["_pid", "correlationId", "start", "_dur"], ascending=[True, True, True, False], kind="stable")
    r = r.drop_duplicates(["_pid", "correlationId"]).sort_values("start", kind="stable")
    names = strings.resolve(r[name_col]) if name_col else np.full(len(r), "", dtype=object)
    tid = r["globalTid"].fillna(-1).to_numpy(np.int64)
    return typed_frame({
        "ts_ns": r["start"].to_numpy(np.int64), "dur_ns": r["_dur"].clip(lower=0).to_numpy(np.int64),
        "name": np.array([_VERSION_SUFFIX.sub("", n) for n in names], dtype=object),
        "correlation": r["correlationId"].to_numpy(np.int64), "process": _process_of(tid), "thread": tid,
        "source": "nsys"}, RUNTIME_COLUMNS)


def _nvtx_frame(conn: sqlite3.Connection, tables: set[str], strings: _Strings) -> pd.DataFrame:
    """Raw NVTX ranges (name, ts_ns, dur_ns, process, thread, kind, domain, payload, source)."""
    raw_cols = ["name", "ts_ns", "dur_ns", "process", "thread", "kind", "domain", "payload", "source"]
    if "NVTX_EVENTS" not in tables:
        return pd.DataFrame({c: [] for c in raw_cols})
    cols = _columns(conn, "NVTX_EVENTS")
    types = dict(_FALLBACK_EVENT_TYPES)
    enum = _enum(conn, tables, "ENUM_NSYS_EVENT_TYPE")
    if enum is not None:
        types = {str(n): int(i) for i, n in zip(enum["id"], enum["name"])}
    push_pop = [types[n] for n in ("NvtxPushPopRange", "NvtxtPushPopRange") if n in types]
    start_end = [types[n] for n in ("NvtxStartEndRange", "NvtxtStartEndRange") if n in types]
    extra = [c for c in ("text", "textId", "domainId", *_PAYLOAD_COLUMNS) if c in cols]
    ev = pd.read_sql_query("SELECT start, end, eventType, globalTid" + "".join(f", {c}" for c in extra) +
                           " FROM NVTX_EVENTS", conn)
    domains: dict[int, str] = {}
    if "domainId" in ev.columns and "NvtxDomainCreate" in types:
        made = ev[ev["eventType"] == types["NvtxDomainCreate"]]
        domains = {int(d): str(t) for d, t in zip(made["domainId"], made.get("text", pd.Series(dtype=object)))
                   if pd.notna(d) and pd.notna(t)}
    ev = ev[ev["eventType"].isin(push_pop + start_end) & ev["end"].notna()]
    text = ev["text"] if "text" in ev.columns else pd.Series([None] * len(ev), index=ev.index, dtype=object)
    if "textId" in ev.columns:  # registered strings carry their name in textId instead of text
        by_id = pd.Series(strings.resolve(ev["textId"]), index=ev.index)
        text = text.where(text.notna(), by_id.where(ev["textId"].notna()))
    payload = pd.Series(pd.NA, index=ev.index, dtype="Int64")
    for c in _PAYLOAD_COLUMNS:
        if c in ev.columns:
            payload = payload.fillna(ev[c].astype("Int64"))
    tid = ev["globalTid"].fillna(-1).to_numpy(np.int64)
    dom = ev["domainId"] if "domainId" in ev.columns else pd.Series(np.nan, index=ev.index)
    return pd.DataFrame({
        "name": text.fillna("").astype(str).to_numpy(object), "ts_ns": ev["start"].to_numpy(np.int64),
        "dur_ns": np.maximum(ev["end"].to_numpy(np.int64) - ev["start"].to_numpy(np.int64), 0),
        "process": _process_of(tid), "thread": tid,
        "kind": np.where(ev["eventType"].isin(push_pop), "cpu", "startend").astype(object),
        "domain": np.array([domains.get(int(d), "") if pd.notna(d) else "" for d in dom], dtype=object),
        "payload": payload.to_numpy(), "source": "nsys"})


def load_nsys(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> KernelTrace:
    """Read an nsys SQLite export (a regular file of at most `max_bytes`) into a KernelTrace."""
    p = Path(path)
    check_regular_file(p, max_bytes)  # SQLite would open a FIFO and wait on it
    conn = _connect(p)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "NVTX_EVENTS", "StringIds"}:
            raise TraceError(f"{p}: a SQLite database, but not an Nsight Systems export (no CUPTI or NVTX tables)")
        strings = _Strings(conn, tables)
        kernels, process = _gpu_frame(conn, tables, strings)
        runtime = _runtime_frame(conn, tables, strings)
        nvtx = _nvtx_frame(conn, tables, strings)
        meta = {k: v for k, v in export_metadata(conn, tables).items()
                if k in ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION")}
        devices: tuple[str, ...] = ()
        if "TARGET_INFO_GPU" in tables and "name" in _columns(conn, "TARGET_INFO_GPU"):
            devices = tuple(str(r[0]) for r in conn.execute("SELECT name FROM TARGET_INFO_GPU"))
    except (sqlite3.Error, pd.errors.DatabaseError, UnicodeDecodeError) as exc:
        raise TraceError(f"{p}: the SQLite export is unreadable or truncated ({exc})") from None
    finally:
        conn.close()
    if kernels.empty:
        raise TraceError(f"{p}: the export has no CUDA kernel or memcpy activity (was nsys run with --trace=cuda?)")
    kernels, ranges = _attribute(kernels, process, runtime, nvtx)
    return KernelTrace(kind="nsys", path=str(p), kernels=kernels, ranges=ranges, runtime=runtime, devices=devices,
                       meta=meta)


def _attribute(kernels: pd.DataFrame, process: np.ndarray, runtime: pd.DataFrame, nvtx: pd.DataFrame
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    pushed = nest_ranges(nvtx[nvtx["kind"] == "cpu"])
    flat = nvtx[nvtx["kind"] == "startend"].assign(depth=0, step_id=-1)
    flat = flat.assign(path=flat["name"])
    ranges = pd.concat([pushed.drop(columns=HELPER_COLUMNS), flat], ignore_index=True)
    ranges = ranges[list(RANGE_COLUMNS)].astype(RANGE_COLUMNS) if len(ranges) else \
        typed_frame({c: [] for c in RANGE_COLUMNS}, RANGE_COLUMNS)
    corr = kernels["correlation"].to_numpy(np.int64)
    rt_corr = runtime["correlation"].to_numpy(np.int64)
    if (process >= 0).all():
        keys = pd.MultiIndex.from_arrays([runtime["process"].to_numpy(np.int64), rt_corr])
        # Unique after the runtime frame's de-duplication, unless a garbled export had non-integral
        # ids that became equal as int64: the first launch wins (get_indexer needs unique keys).
        first = np.flatnonzero(~keys.duplicated())
        pos = keys[first].get_indexer(pd.MultiIndex.from_arrays([process, corr]))
        at_row = np.where(pos >= 0, first[pos] if len(first) else pos, -1)
    else:  # an export without globalPid on GPU rows: the earliest launch with that id
        first = np.flatnonzero(~pd.Series(rt_corr, dtype=np.int64).duplicated().to_numpy())
        pos = pd.Index(rt_corr[first]).get_indexer(corr)
        at_row = first[pos] if len(first) else pos
        at_row[pos < 0] = -1
    known = at_row >= 0
    hit = np.full(len(kernels), -1, dtype=np.int64)
    hit[known] = enclosing_range(pushed, runtime["process"].to_numpy(np.int64)[at_row[known]],
                                 runtime["thread"].to_numpy(np.int64)[at_row[known]],
                                 runtime["ts_ns"].to_numpy(np.int64)[at_row[known]])
    ok = hit >= 0
    path = np.full(len(kernels), "", dtype=object)
    step = np.full(len(kernels), -1, dtype=np.int64)
    path[ok] = pushed["path"].to_numpy(object)[hit[ok]]
    step[ok] = pushed["step_id"].to_numpy(np.int64)[hit[ok]]
    order = np.argsort(kernels["ts_ns"].to_numpy(np.int64), kind="stable")
    out = kernels.assign(range_path=path, step_id=step).iloc[order].reset_index(drop=True)
    return out, ranges
