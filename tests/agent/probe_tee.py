"""ProbeTee: the raw probe calls an engine makes, recorded in the test's own process beside the ring
(imported, not a conftest). The tests' independent record of what the agent should report: KV block
events and request finishes, kept as the engine called its observer, never through the agent."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from infersight.probes.observer import ProbeObserver


@dataclass
class ProbeTee:
    kv: list[tuple[str, int, int]] = field(default_factory=list)  # (event name lower case, block id, request id)
    finished_wall: dict[int, float] = field(default_factory=dict)  # request id -> wall-clock time of FINISHED
    arrived_task: dict[int, str] = field(default_factory=dict)

    @classmethod
    def attach(cls, probe: ProbeObserver, tasks: dict[int, str] | None = None) -> "ProbeTee":
        """Record `probe`'s KV and finish calls (instance attributes shadow its methods; the ring still gets them)."""
        tee = cls()
        on_kv, on_finished = probe.on_kv_block, probe.on_request_finished

        def kv(event, block_id, request_id, block_hash):  # type: ignore[no-untyped-def]
            tee.kv.append((event.name.lower(), int(block_id), int(request_id)))
            on_kv(event, block_id, request_id, block_hash)

        def finished(request_id, t_ns, reason, num_output_tokens):  # type: ignore[no-untyped-def]
            tee.finished_wall[int(request_id)] = time.time()
            on_finished(request_id, t_ns, reason, num_output_tokens)

        probe.on_kv_block, probe.on_request_finished = kv, finished  # type: ignore[method-assign]
        return tee

    def evictions(self) -> list[tuple[int, int]]:
        """(evictor, victim) per EVICTED call in order: the victim is the request of the block's last CACHED
        call before it (-1 when none), the evictor the EVICTED call's request."""
        last_cached: dict[int, int] = {}
        out = []
        for name, block, rid in self.kv:
            if name == "cached":
                last_cached[block] = rid
            elif name == "evicted":
                out.append((rid, last_cached.pop(block, -1)))
        return out
