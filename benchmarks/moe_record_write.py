"""The host time of ProbeObserver.on_expert_counts for a host tensor of counts: one step's MOE records into
the ring, by shape (layers x experts): what an observed MoE engine pays per step for its expert counts, less
the device copy (on CUDA the counts come back to pinned memory first and are written one step later).

    taskset -c 1 python benchmarks/moe_record_write.py            # tiny-moe, Mixtral's and DeepSeek-V3's shapes

Prints per shape the median over 30 blocks of 50 calls (the ring drained between blocks, outside the time).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.probes.records import record_registry  # noqa: E402
from infersight.probes.ring import RingConsumer  # noqa: E402

SHAPES = {"tiny-moe": (4, 8), "Mixtral-8x7B": (32, 8), "DeepSeek-V3": (61, 256)}


def main() -> int:
    for name, shape in SHAPES.items():
        observer = ProbeObserver(ProbeConfig(ring_name=f"infersight-moe-write-{time.monotonic_ns()}", nvtx=False,
                                             ring_capacity=1 << 16))
        consumer = RingConsumer.attach(observer.ring_name, record_registry())
        counts = torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(0))
        blocks = []
        try:
            for block in range(30):
                t0 = time.perf_counter_ns()
                for step in range(50):
                    observer.on_expert_counts(block * 50 + step, counts)
                blocks.append((time.perf_counter_ns() - t0) / 50 / 1e3)
                consumer.read()
        finally:
            consumer.close()
            observer.close()
        print(f"{name:13s} {shape[0]:3d} x {shape[1]:3d}: {statistics.median(blocks):7.1f} us a step (measured: median "
              f"of 30 blocks of 50 calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
