"""The start-up heap, frozen out of Python's cyclic collector once a process is built and warm.

What start-up leaves behind (every imported module, torch's and the model's objects, the tokenizer, the web
framework) lives as long as the process, yet each full collection of the cyclic collector walks all of it again:
on the engine's thread that is a pause every stream feels as one late token, on the HTTP side a late chunk.
Frozen after the warm-up (what vLLM's engine core and API server do at start-up, `gc.freeze`), full collections
walk only what serving allocated since; the frozen objects are never collected, which costs nothing for objects
that live as long as the process anyway.
"""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("infersight.serve")


@dataclass(frozen=True, slots=True)
class FrozenHeap:
    """What one freeze did: objects in the permanent generation after it, and the seconds it took."""

    objects: int
    seconds: float


def freeze_startup_heap() -> FrozenHeap:
    """Collect what start-up left unreachable, then freeze the survivors (call once the process is warm); logged."""
    began = time.perf_counter()
    gc.collect()  # garbage of the start-up is freed, not frozen for the process's life
    gc.freeze()
    heap = FrozenHeap(gc.get_freeze_count(), time.perf_counter() - began)
    log.info("froze %d start-up objects out of the cyclic collector in %.1f ms", heap.objects, 1e3 * heap.seconds)
    return heap
