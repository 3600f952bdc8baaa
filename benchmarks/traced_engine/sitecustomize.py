"""tracemalloc in `infersight serve`'s engine process, for benchmarks/serving_soak.py --traced-engine FILE.

Python imports `sitecustomize` at start-up from the path; serving_soak puts this folder on serve's
PYTHONPATH with INFERSIGHT_TRACED_ENGINE=FILE set, so serve's processes load it. Only a multiprocessing
child (the engine process: serve spawns it) traces; the HTTP front end does not. It reuses
benchmarks/agent_traced.py's snapshot thread: first snapshot after INFERSIGHT_TRACED_FIRST_S, then every
INFERSIGHT_TRACED_EVERY_S, the allocation sites that grew most written to FILE. tracemalloc slows the
engine, so the soak's rates mean nothing in such a run; what it shows is whether the engine's Python heap
grows (and where) while its resident set does: a flat traced heap under a growing RSS points below Python
(the C heap, torch's allocator).
"""
import os
import sys


def _start() -> None:
    out = os.environ.get("INFERSIGHT_TRACED_ENGINE")
    # A spawned multiprocessing child runs `python -c "...spawn_main(...)" --multiprocessing-fork`.
    if not out or "--multiprocessing-fork" not in sys.argv:
        return
    import threading
    import tracemalloc
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agent_traced import snapshots  # benchmarks/agent_traced.py

    tracemalloc.start(int(os.environ.get("INFERSIGHT_TRACED_FRAMES", "4")))
    path = Path(out)
    path.write_text("")
    threading.Thread(target=snapshots, daemon=True, name="infersight-traced-engine",
                     args=(path, float(os.environ.get("INFERSIGHT_TRACED_FIRST_S", "300")),
                           float(os.environ.get("INFERSIGHT_TRACED_EVERY_S", "300")), 15)).start()


_start()
