"""ProbeTee: the raw probe calls an engine makes, recorded in the test's own process beside the ring
(imported, not a conftest). The tests' independent record of what the agent should report: KV block
events, request finishes, verifications and expert counts, kept as the engine called its observer,
never through the agent."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from infersight.probes.observer import ProbeObserver


@dataclass
class ProbeTee:
    kv: list[tuple[str, int, int]] = field(default_factory=list)  # (event name lower case, block id, request id)
    finished_wall: dict[int, float] = field(default_factory=dict)  # request id -> wall-clock time of FINISHED
    verified: list[tuple[int, int, int]] = field(default_factory=list)  # (request id, proposed, accepted)
    expert_tokens: list[list[int]] = field(default_factory=list)  # [layer][expert] tokens routed, summed over steps

    @classmethod
    def attach(cls, probe: ProbeObserver, tasks: dict[int, str] | None = None) -> "ProbeTee":
        """Record `probe`'s KV and finish calls (instance attributes shadow its methods; the ring still gets them)."""
        tee = cls()
        on_kv, on_finished = probe.on_kv_block, probe.on_request_finished
        on_spec, on_experts = probe.on_spec_verified, probe.on_expert_counts

        def kv(event, block_id, request_id, block_hash):  # type: ignore[no-untyped-def]
            tee.kv.append((event.name.lower(), int(block_id), int(request_id)))
            on_kv(event, block_id, request_id, block_hash)

        def finished(request_id, t_ns, reason, num_output_tokens):  # type: ignore[no-untyped-def]
            tee.finished_wall[int(request_id)] = time.time()
            on_finished(request_id, t_ns, reason, num_output_tokens)

        def spec(request_id, num_proposed, num_accepted, *rest):  # type: ignore[no-untyped-def]
            tee.verified.append((int(request_id), int(num_proposed), int(num_accepted)))
            on_spec(request_id, num_proposed, num_accepted, *rest)

        def experts(step_id, counts):  # type: ignore[no-untyped-def]
            rows = counts.cpu().tolist()
            if not tee.expert_tokens:
                tee.expert_tokens = [[0] * len(r) for r in rows]
            tee.expert_tokens = [[a + int(b) for a, b in zip(acc, r)] for acc, r in zip(tee.expert_tokens, rows)]
            on_experts(step_id, counts)

        probe.on_kv_block, probe.on_request_finished = kv, finished  # type: ignore[method-assign]
        probe.on_spec_verified, probe.on_expert_counts = spec, experts  # type: ignore[method-assign]
        return tee

    def accept_rate_by_task(self, tasks: dict[int, str]) -> dict[str, float]:
        """accepted / proposed summed per task (tasks: request id -> task)."""
        sums: dict[str, list[int]] = {}
        for rid, proposed, accepted in self.verified:
            acc = sums.setdefault(tasks[rid], [0, 0])
            acc[0], acc[1] = acc[0] + proposed, acc[1] + accepted
        return {task: a / p for task, (p, a) in sums.items() if p}

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
