"""serve.startup_heap: what start-up left unreachable is freed, what survives is frozen, what comes after is not.

Run in a fresh interpreter: this suite's own process already froze its heap (tests/conftest.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import gc, json, weakref
    from infersight.serve.startup_heap import freeze_startup_heap

    class Node:
        pass

    kept = [[i] for i in range(5000)]       # 5,001 lists that live on
    cycle = Node(); cycle.me = cycle         # garbage in a cycle: only the collector frees it
    gone = weakref.ref(cycle); del cycle
    before = gc.get_freeze_count()
    heap = freeze_startup_heap()
    later = [0]
    tracked = {id(o) for o in gc.get_objects()}
    print(json.dumps({"before": before, "after": gc.get_freeze_count(), "reported": heap.objects,
                      "cycle_freed": gone() is None,
                      "kept_tracked": sum(id(x) in tracked for x in kept) + (id(kept) in tracked),
                      "later_tracked": id(later) in tracked}))
""")


def test_the_survivors_are_frozen_the_garbage_freed_and_later_objects_still_collected() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["before"] == 0 and got["reported"] == got["after"]
    assert got["after"] >= 5001           # at least the kept lists went to the permanent generation
    assert got["cycle_freed"] is True     # collected first, not kept for the process's life
    assert got["kept_tracked"] == 0       # no later collection walks them
    assert got["later_tracked"] is True   # what serving allocates is collected as before
