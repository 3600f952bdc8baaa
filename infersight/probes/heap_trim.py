"""Give the C heap's free pages back to the system after a capture that grew it.

A capture's profiler events are C++ allocations (Kineto's buffers, torch's event records). Freed at the
window's end (capture.release_results), glibc keeps the pages: a 20-step full capture of tiny-moe decode
left the engine's RSS 190-197 MB higher for good, and `infersight serve`'s engine process stepped from
535 to 793 MB at one triggered capture in a 35-minute soak (BENCHMARKS.md). `malloc_trim(0)` returned all
of it in 11-14 ms. Small flight-recorder windows leave free pages too: beside `serve` each left 5-12 MB
behind in the engine thread's arena (mallinfo2: bytes in use flat at ~127 MB, free bytes 14 -> 52 MB over
eight minutes, RssAnon 290 -> 328 MB), none of them enough to cross a per-window threshold. So the capture
trims once the resident set is more than `TRIM_ABOVE_BYTES` above where it stood after the last trim (or
before the first window). Beside `serve` that is in effect after every window (each touches ~20 MB that the
last trim returned): 1.4-7.1 ms a trim, median 2.2, inside the window's last step, so the recorder's measured
window cost counts it.

glibc only (musl and other libcs have no malloc_trim): elsewhere `trim_heap` does nothing and says so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

#: A window that ends with the resident set this far above its level after the last trim is followed by one.
TRIM_ABOVE_BYTES = 16 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _libc_trim() -> "ctypes._CFuncPtr | None":
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def resident_bytes() -> int:
    """This process's resident set (statm's second field: a read of one short /proc file)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def trim_heap() -> bool:
    """malloc_trim(0): free heap pages back to the system. False where the libc has none."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
