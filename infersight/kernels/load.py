"""Which kind of capture a file is (by content, then by name), and loading it.

kineto: JSON (optionally gzipped) whose top level is an object or a list of events.
nsys: an SQLite database (the "SQLite format 3" header).
ncu: text with a quoted "ID",...,"Kernel Name" CSV header, possibly after "==PROF==" lines.
prometheus: Prometheus / OpenMetrics exposition text (dcgm-exporter, vLLM, SGLang /metrics).
Report files that need exporting first (.nsys-rep, .qdrep, .ncu-rep) get a message saying how.
"""
from __future__ import annotations

import re
from pathlib import Path

from infersight.kernels.frames import KernelTrace, TraceError

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


def detect_kind(path: str | Path) -> str:
    """kineto | nsys | ncu | prometheus, or TraceError with what was expected."""
    p = Path(path)
    for suffix, hint in _EXPORT_HINTS.items():
        if p.name.endswith(suffix):
            raise TraceError(f"{p}: a binary report; {hint.format(path=p)}")
    try:
        with p.open("rb") as f:
            head = f.read(1 << 16)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the file ({exc.strerror or exc})") from None
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


def load_trace(path: str | Path, kind: str | None = None) -> KernelTrace:
    """Parse a kernel-level capture (kineto, nsys or ncu) into a KernelTrace. A capture that is
    well-formed at the file level but not in the shape its kind promises (a JSON object where
    an event list should be, a column of the wrong type) is a TraceError too, not a traceback."""
    kind = kind or detect_kind(path)
    if kind == "prometheus":
        raise TraceError(f"{path}: Prometheus text holds metrics, not kernels")
    try:
        if kind == "kineto":
            from infersight.kernels.kineto import load_kineto
            return load_kineto(path)
        if kind == "nsys":
            from infersight.kernels.nsys import load_nsys
            return load_nsys(path)
        if kind == "ncu":
            from infersight.kernels.ncu import load_ncu
            return load_ncu(path)
    except (KeyError, TypeError, IndexError, AttributeError, OverflowError, RecursionError) as exc:
        raise TraceError(f"{path}: a malformed {kind} capture ({type(exc).__name__}: {exc})") from None
    raise TraceError(f"{path}: unknown capture kind {kind!r}")
