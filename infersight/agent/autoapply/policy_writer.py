"""PolicyWriter: the policy table the loop has in force, written to the control block of every engine
the agent reads (probes.policy_block). The one writer: the loop, on the agent's poll thread.

An engine without a policy region (an older engine, or vLLM's ring, which has no control block) cannot
change at run time: `writable` says so, and the loop renders its advice as flags instead
(agent.autoapply.vllm_flags).
"""
from __future__ import annotations

import logging
from typing import Callable

from infersight.probes.control import ControlBlock, control_name
from infersight.probes.policy_block import TaskPolicy, configured_max_num_seqs, has_policy, read_ack, write_policy

log = logging.getLogger("infersight.agent")


class PolicyWriter:
    def __init__(self, rings: Callable[[], list[str]]) -> None:
        self.rings = rings
        self.tasks: dict[str, TaskPolicy] = {}
        self.max_num_seqs = 0
        self.seq = 0
        self._blocks: dict[str, ControlBlock] = {}

    def _attached(self) -> list[ControlBlock]:
        out = []
        for ring in self.rings():
            block = self._blocks.get(ring)
            if block is None:
                try:
                    block = ControlBlock(control_name(ring), create=False)
                except (FileNotFoundError, ValueError):
                    continue  # vLLM's ring, or an engine gone: nothing to write to
                self._blocks[ring] = block
            if has_policy(block.shm.buf):
                out.append(block)
        return out

    @property
    def writable(self) -> bool:
        """Whether some engine the agent reads takes a run-time policy."""
        return bool(self._attached())

    def configured_max_num_seqs(self) -> int:
        """The scheduler limit the (first) engine was started with; 0 when unknown."""
        blocks = self._attached()
        return configured_max_num_seqs(blocks[0].shm.buf) if blocks else 0

    def publish(self) -> int:
        """Write the table to every engine; returns the new seq (the same on each: the loop is their one
        writer, so their seqs move together). 0 when no engine takes it."""
        seq = 0
        for block in self._attached():
            seq = write_policy(block.shm.buf, self.max_num_seqs, tuple(self.tasks.values()))
        self.seq = seq
        log.info("policy %d written: max_num_seqs=%d, tasks=%s", seq, self.max_num_seqs,
                 {t.label: (t.speculate, t.old_speculate, t.control_share) for t in self.tasks.values()})
        return seq

    def acknowledged(self) -> bool:
        """Whether every engine applied the last seq written."""
        return all(read_ack(b.shm.buf) >= self.seq for b in self._attached())

    def close(self) -> None:
        for block in self._blocks.values():
            block.close()
        self._blocks.clear()
