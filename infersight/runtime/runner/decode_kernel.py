"""The decode attention kernel an engine runs: the config's choice, checked against the machine."""
from __future__ import annotations

import logging

log = logging.getLogger("infersight.runtime")


def usable_decode_kernel(resolved: str, requested: str, device: str) -> str:
    """`resolved` (EngineConfig.resolved_decode_attention), except that an automatic pick (`requested`
    auto) of Triton falls back to torch, with a warning, when the kernel does not run on `device`."""
    if resolved == "triton" and requested == "auto":
        from infersight.runtime.model.triton_decode import triton_decode_problem  # imports triton: CUDA only

        problem = triton_decode_problem(device)
        if problem:
            log.warning("Triton decode attention unavailable (%s); using the torch path", problem)
            return "torch"
    return resolved
