"""What keeps growing in the agent once its bounds are full: tracemalloc between two points of a
synthetic stream, by allocation site.

The agent (AgentState and its parts, in this process, GPU off) polls a probe ring that this script
fills with `infersight bench agent`'s engine-shaped synthetic requests (bench.agent.synthetic_workload,
48 tokens each, waves of 32). After --warm requests (retention at --retention-mib, small, so that it
is full by then), tracemalloc starts; a snapshot after --first more requests, another after --second
more; the sites whose traced bytes grew most between the two are printed. A bounded agent shows no
site growing in proportion to the requests; RSS is printed too (it includes this process's writer
and torch, so only its difference means anything, and less than the traced one).

    python benchmarks/agent_memory_growth.py [--warm 20000] [--first 5000] [--second 15000] [--retention-mib 1]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warm", type=int, default=20_000, help="requests before tracemalloc starts")
    ap.add_argument("--first", type=int, default=5_000, help="requests before the first snapshot")
    ap.add_argument("--second", type=int, default=15_000, help="requests between the two snapshots")
    ap.add_argument("--retention-mib", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()

    from infersight.agent.lean_imports import import_pandas_without_pyarrow

    import_pandas_without_pyarrow()  # as `infersight agent` does
    from infersight.agent.config import AgentConfig
    from infersight.agent.gpu_config import GpuConfig
    from infersight.agent.rows.retention_config import RetentionConfig
    from infersight.agent.service import Agent
    from infersight.bench.agent import synthetic_workload
    from infersight.probes.config import ProbeConfig
    from infersight.probes.observer import ProbeObserver

    ring = f"infersight-memgrowth-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=ring, nvtx=False))
    agent = Agent(AgentConfig(rings=[ring], port=0, gpu=GpuConfig(source="none"),
                              retention=RetentionConfig(rows_bytes=int(args.retention_mib * (1 << 20)))))
    state = {"step": 0, "rid": 0}

    def feed(n: int) -> None:
        for _ in range(n // 32):
            state["step"] = synthetic_workload(probe, 32, 48, first_id=state["rid"], first_step=state["step"])
            state["rid"] += 32
            agent.poll_once()

    try:
        feed(args.warm)
        tracemalloc.start(3)
        feed(args.first)
        gc.collect()
        first, rss_first, traced_first = tracemalloc.take_snapshot(), rss_mb(), tracemalloc.get_traced_memory()[0]
        feed(args.second)
        gc.collect()
        second, rss_second, traced_second = tracemalloc.take_snapshot(), rss_mb(), tracemalloc.get_traced_memory()[0]
        print(f"requests: {args.warm} warm, then {args.first}, then {args.second} between the snapshots")
        print(f"traced: {traced_first / 2**20:.2f} -> {traced_second / 2**20:.2f} MiB "
              f"(+{(traced_second - traced_first) / 2**20:.2f}); RSS {rss_first:.1f} -> {rss_second:.1f} MB")
        for stat in second.compare_to(first, "traceback")[:args.top]:
            where = " <- ".join(f"{Path(fr.filename).name}:{fr.lineno}" for fr in reversed(stat.traceback))
            print(f"{stat.size_diff / 1024:+9.0f} KiB {stat.count_diff:+8d} blocks  {where}")
    finally:
        agent.close()
        probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
