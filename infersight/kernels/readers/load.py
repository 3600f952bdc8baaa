"""Which kind of capture a file is (by content, then by name), and loading it.

kineto: JSON (optionally gzipped) whose top level is an object or a list of events.
nsys: an SQLite database (the "SQLite format 3" header).
ncu: text with a quoted "ID",...,"Kernel Name" CSV header, possibly after "==PROF==" lines.
prometheus: Prometheus / OpenMetrics exposition text (dcgm-exporter, vLLM, SGLang /metrics).
Report files that need exporting first (.nsys-rep, .qdrep, .ncu-rep) get a message saying how.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from infersight.kernels.frames import KernelTrace, TraceError
from infersight.kernels.readers.input_files import MAX_FILE_BYTES, read_regular_file

_SQLITE_MAGIC = b"SQLite format 3\x00"
_GZIP_MAGIC = b"\x1f\x8b"
_NCU_HEADER = re.compile(r'^"ID","Process ID"|^"ID",.*"Kernel Name"', re.MULTILINE)
_PROM_SAMPLE = re.compile(r'^[A-Za-z_:][A-Za-z0-9_:]*(\{.*\})?\s+(?:[-+]?(?:\d|\.\d)[\d.eE+-]*|[-+]?Inf|NaN)'
                          r'(\s+-?\d+)?\s*$')
_PROM_COMMENT = re.compile(r"^#\s*(HELP|TYPE|UNIT|EOF)\b")
_EXPORT_HINTS = {
    ".nsys-rep": "export it first: nsys export --type sqlite --output trace.sqlite {path}",
    ".qdrep": "export it first: nsys export --type sqlite --output trace.sqlite {path}",
    ".ncu-rep": "export it first: ncu --import {path} --csv --page raw > kernels.csv",
}
_KINDS = "a Kineto trace (.json / .json.gz), an nsys SQLite export (.sqlite), an ncu CSV (.csv / .log) " \
         "or Prometheus / dcgm-exporter text"


def looks_like_exposition(text: str) -> bool:
    """Most non-blank lines are samples or # HELP / # TYPE comments, and at least one is a sample."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return False
    samples = sum(1 for ln in lines if _PROM_SAMPLE.match(ln))
    comments = sum(1 for ln in lines if _PROM_COMMENT.match(ln))
    return samples > 0 and samples + comments >= 0.9 * len(lines)


def detect_kind(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """kineto | nsys | ncu | prometheus, or TraceError with what was expected (also for a path that
    is not a regular file, or one over `max_bytes`: see input_files)."""
    p = Path(path)
    for suffix, hint in _EXPORT_HINTS.items():
        if p.name.endswith(suffix):
            raise TraceError(f"{p}: a binary report; {hint.format(path=p)}")
    head = read_regular_file(p, max_bytes, head=1 << 16)
    if not head.strip():
        raise TraceError(f"{p}: the file is empty; expected {_KINDS}")
    if head.startswith(_SQLITE_MAGIC):
        return "nsys"
    if head.startswith(_GZIP_MAGIC):
        return "kineto"  # the only gzipped kind we read; kineto.py reports a bad stream clearly
    text = head.decode("utf-8", errors="replace")
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped[:1] in ("{", "["):
        return "kineto"
    if _NCU_HEADER.search(text) or stripped.startswith("==PROF=="):
        return "ncu"
    if looks_like_exposition(text if len(head) < (1 << 16) else text.rsplit("\n", 1)[0]):
        return "prometheus"
    raise TraceError(f"{p}: not a recognised capture; expected {_KINDS}")


@contextmanager
def malformed_as_trace_error(path: str | Path, kind: str) -> Iterator[None]:
    """Turns what a parser raises on a file that is well-formed at the file level but not in the
    shape its kind promises (KeyError, TypeError, a number no column can hold, ...) into one
    TraceError line naming the file and the kind."""
    try:
        yield
    except TraceError:
        raise
    except (KeyError, TypeError, IndexError, AttributeError, ArithmeticError, RecursionError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:200]  # one line, whatever the library's message was
        raise TraceError(f"{path}: a malformed {kind} capture ({type(exc).__name__}: {detail})") from None


def load_trace(path: str | Path, kind: str | None = None, max_bytes: int = MAX_FILE_BYTES) -> KernelTrace:
    """Parse a kernel-level capture (kineto, nsys or ncu) of at most `max_bytes` into a KernelTrace.
    A malformed capture is a TraceError too, not a traceback (see malformed_as_trace_error)."""
    kind = kind or detect_kind(path, max_bytes)
    if kind == "prometheus":
        raise TraceError(f"{path}: Prometheus text holds metrics, not kernels")
    with malformed_as_trace_error(path, kind):
        if kind == "kineto":
            from infersight.kernels.readers.kineto import load_kineto
            return load_kineto(path, max_bytes)
        if kind == "nsys":
            from infersight.kernels.readers.nsys import load_nsys
            return load_nsys(path, max_bytes)
        if kind == "ncu":
            from infersight.kernels.readers.ncu import load_ncu
            return load_ncu(path, max_bytes)
    raise TraceError(f"{path}: unknown capture kind {kind!r}")
