"""glibc's own account of `infersight serve`'s engine-process heap, for benchmarks/serving_soak.py --engine-heap FILE.

Loaded at start-up like benchmarks/traced_engine (serving_soak puts this folder on serve's PYTHONPATH with
INFERSIGHT_ENGINE_HEAP=FILE set); only the spawned engine process acts. Every INFERSIGHT_ENGINE_HEAP_EVERY_S
(default 15) a thread appends one line to FILE: seconds since start, mallinfo2's bytes the arenas hold
(`arena`), of them in use (`uordblks`) and free (`fordblks`), mmapped chunks (`hblkhd`), and the process's
RssAnon, all in MiB. Growth in free bytes under a flat in-use figure is pages the allocator kept after a
burst (a capture window's profiler events), which malloc_trim returns; growth in use is live data. Costs
one mallinfo2 (a walk of the arenas' bins) per line: the soak's rates stay comparable.
"""
import os
import sys


def _start() -> None:
    out = os.environ.get("INFERSIGHT_ENGINE_HEAP")
    if not out or "--multiprocessing-fork" not in sys.argv:  # the spawned engine process only
        return
    import ctypes
    import threading
    import time

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):  # not glibc >= 2.33: nothing to report
        return
    every = float(os.environ.get("INFERSIGHT_ENGINE_HEAP_EVERY_S", "15"))

    def rss_anon_kib() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))

    def run() -> None:
        t0 = time.monotonic()
        with open(out, "w") as f:
            f.write("t_s arena_mib in_use_mib free_mib mmapped_mib rss_anon_mib\n")
            while True:
                m = libc.mallinfo2()
                f.write(f"{time.monotonic() - t0:.0f} {m.arena / 2**20:.1f} {m.uordblks / 2**20:.1f} "
                        f"{m.fordblks / 2**20:.1f} {m.hblkhd / 2**20:.1f} {rss_anon_kib() / 1024:.1f}\n")
                f.flush()
                time.sleep(every)

    threading.Thread(target=run, daemon=True, name="infersight-engine-heap").start()


_start()
