"""nsys SQLite export -> frames: the real saxpy export checked with SQL, and a synthetic export
in a newer schema (META_DATA_EXPORT, ENUM tables with other ids, payloads, nested ranges)."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

import pytest

from infersight.kernels.frames import TraceError
from infersight.kernels.readers.nsys import load_nsys

SAXPY = "nsys_saxpy_mpi_cuda_a100.sqlite"


def _query(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_saxpy_counts_and_times(shared_fixture: Callable[[str], Path]) -> None:
    path = shared_fixture(SAXPY)
    trace = load_nsys(path)
    k = trace.kernels
    [(n, total)] = _query(path, "SELECT COUNT(*), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    kernels = k[k["category"] == "kernel"]
    assert (len(kernels), int(kernels["dur_ns"].sum())) == (n, total)
    [(n, total, moved)] = _query(path, "SELECT COUNT(*), SUM(end - start), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    copies = k[k["category"] == "gpu_memcpy"]
    assert (len(copies), int(copies["dur_ns"].sum()), int(copies["bytes"].sum())) == (n, total, moved)
    kinds = dict(_query(path, "SELECT copyKind, COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"))
    assert copies["name"].value_counts().to_dict() == {"Memcpy HtoD": kinds[1], "Memcpy DtoH": kinds[2]}
    [(name,)] = _query(path, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                             "ON s.id = k.demangledName LIMIT 1")
    assert set(kernels["name"]) == {name}
    assert set(kernels["grid"]) == {"(2,1,1)"} and set(kernels["block"]) == {"(512,1,1)"}
    # Runtime rows de-duplicated per correlation id, version suffixes dropped.
    [(distinct,)] = _query(path, "SELECT COUNT(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    assert len(trace.runtime) == distinct and trace.runtime["correlation"].is_unique
    assert not trace.runtime["name"].str.contains(r"_v\d+$").any()
    assert trace.devices == ("NVIDIA A100-SXM4-40GB",)
    assert trace.meta["EXPORT_SCHEMA_VERSION"] == "2.9.1"  # read from EXPORT_META_DATA (older name)


def test_saxpy_nvtx_attribution(shared_fixture: Callable[[str], Path]) -> None:
    """Each activity's path is the innermost push/pop range open on its launch's thread at the
    launch's start (the saxpy ranges do not nest, so the path is that one name)."""
    path = shared_fixture(SAXPY)
    expected = dict(_query(path, """
        WITH launch AS (SELECT correlationId, MIN(start) AS start, globalTid
                        FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY correlationId),
             gpu AS (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL
                     UNION ALL SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY)
        SELECT gpu.correlationId,
               (SELECT COALESCE(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                WHERE n.eventType = 59 AND n.globalTid = launch.globalTid
                  AND n.start <= launch.start AND n.end > launch.start
                ORDER BY n.start DESC LIMIT 1)
        FROM gpu JOIN launch USING (correlationId)"""))
    k = load_nsys(path).kernels
    got = dict(zip(k["correlation"], k["range_path"]))
    assert got == {c: (p or "") for c, p in expected.items()}
    assert set(k.loc[k["category"] == "kernel", "range_path"]) == {"saxpy"}
    # The MPI ranges carry their names in textId -> StringIds and sit in domain "MPI".
    ranges = load_nsys(path).ranges
    assert set(ranges.loc[ranges["domain"] == "MPI", "name"]) == {"MPI_Init", "MPI_Send", "MPI_Recv", "MPI_Finalize"}
    [(pushes,)] = _query(path, "SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType = 59")
    assert len(ranges) == pushes


def _tid(pid: int, tid: int) -> int:
    return (pid << 24) | tid


def _write_new_schema(path: Path) -> None:
    main, other = _tid(1234, 1235), _tid(1234, 1300)
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
        CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, rangeId INTEGER, text TEXT,
            globalTid INTEGER, textId INTEGER, domainId INTEGER, int64Value INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, eventClass INTEGER,
            globalTid INTEGER, correlationId INTEGER, nameId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER,
            blockZ INTEGER, demangledName INTEGER, shortName INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, bytes INTEGER, copyKind INTEGER);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.11.0');
        INSERT INTO StringIds VALUES (1, 'step'), (3, 'layer.0.attention'), (4, 'void flash_fwd_kernel<128>(Params)'),
            (5, 'cudaLaunchKernel'), (6, 'cudaLaunchKernel_v7000'), (7, 'flash_fwd_kernel');
        -- ids deliberately unlike the fixed ones of older exports (59 push/pop, 60 start/end, 75 domain)
        INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (100, 'NvtxPushPopRange', 'NVTX push/pop range'),
            (101, 'NvtxStartEndRange', 'NVTX start/end range'), (102, 'NvtxDomainCreate', 'NVTX domain create'),
            (59, 'SomethingElse', 'not an NVTX range here');
        INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1, 'CUDA_MEMCPY_OPER_HTOD', 'Host-to-Device');
    """)
    conn.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?)", [
        (0, None, 102, "infersight", main, None, 5, None),
        (0, 1000, 100, None, main, 1, 5, 42),               # step 42 (payload), name by textId
        (10, 900, 100, "forward.decode", main, None, 5, None),
        (100, 300, 100, None, main, 3, 5, None),
        (1000, 2000, 100, None, main, 1, 5, 43),            # step 43
        (50, 1500, 101, "request 7", other, None, 0, None),  # start/end: listed, not nested
        (400, 500, 59, "not a range", main, None, 0, None),  # eventType 59 means something else here
        (1900, None, 100, "never popped", main, None, 5, None),
    ])
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?)", [
        (150, 160, main, 1, 5), (151, 159, main, 1, 6),     # one call recorded twice
        (1100, 1110, main, 2, 5), (950, 955, main, 3, 5)])
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, 4, 2, 1, 128, 1, 1, 4, 7)",
                     [(200, 260, 1), (1200, 1300, 2)])
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (960, 980, 0, 7, 3, 4096, 1)")
    conn.commit()
    conn.close()


def test_newer_schema_enums_payloads_and_nesting(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    _write_new_schema(path)
    trace = load_nsys(path)
    k = trace.kernels.set_index("correlation")
    assert k.loc[1, "range_path"] == "step/forward.decode/layer.0.attention" and k.loc[1, "step_id"] == 42
    assert k.loc[1, "name"] == "void flash_fwd_kernel<128>(Params)" and k.loc[1, "grid"] == "(4,2,1)"
    assert k.loc[2, "range_path"] == "step" and k.loc[2, "step_id"] == 43
    assert k.loc[3, "name"] == "Memcpy Host-to-Device" and k.loc[3, "range_path"] == "step"
    assert k.loc[3, "step_id"] == 42 and k.loc[3, "bytes"] == 4096
    assert list(trace.runtime["name"]) == ["cudaLaunchKernel"] * 3
    r = trace.ranges
    assert sorted(r["name"]) == sorted(["step", "forward.decode", "layer.0.attention", "step", "request 7"])
    steps = r[r["name"] == "step"]
    assert list(steps["payload"]) == [42, 43] and set(steps["domain"]) == {"infersight"}
    assert r.loc[r["name"] == "request 7", "kind"].item() == "startend"
    assert r.loc[r["name"] == "layer.0.attention", "depth"].item() == 2
    assert trace.meta == {"EXPORT_SCHEMA_VERSION": "3.11.0"}


def test_not_an_nsys_export(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(TraceError, match="not an Nsight Systems export"):
        load_nsys(path)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"SQLite format 3\x00" + b"\x07" * 600)
    with pytest.raises(TraceError, match="SQLite"):
        load_nsys(garbage)
