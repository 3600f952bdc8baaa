"""GET /api/v1/decisions?limit=N: the closed loop's decisions (agent.autoapply.decisions), what is in
force, and, when the agent reads a vLLM (--vllm-url, a vLLM plugin's ring, or rings of which none takes
a run-time policy), the same advice as the flags to restart it with (agent.autoapply.vllm_flags). Served whether the loop is on or not ("auto_apply": "off" then).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.autoapply.part import AutoApplyPart
from infersight.agent.autoapply.policy_writer import PolicyWriter
from infersight.agent.autoapply.vllm_flags import vllm_flag_advice
from infersight.agent.state import AgentState
from infersight.correlate import spec_advice, spec_speedup

#: Ring names the vLLM plugin writes (infersight.vllm.writer): a vLLM is behind them.
VLLM_RING_PREFIX = "infersight-vllm-"


def vllm_document(state: AgentState, config: AutoApplyConfig) -> dict[str, Any]:
    """The vLLM flags with the measurements the agent has (its state's finished rows and steps)."""
    by_task = spec_speedup.speedup_by_task(state.spec_events, state.spec_step_timing,
                                           spec_speedup.model_error(state.engine_on_gpu))
    rows = state.finished.frame()
    ttft = rows["ttft_s"].to_numpy(np.float64) if "ttft_s" in rows else np.empty(0)
    itl = rows["itl_mean_s"].to_numpy(np.float64) if "itl_mean_s" in rows else np.empty(0)
    keep = np.isfinite(ttft)
    steps = state.recent_steps_frame()
    peak = int(steps["running"].max()) if len(steps) and "running" in steps else None
    slo = (config.slo_ttft_s, config.slo_itl_s) if config.slo_ttft_s and config.slo_itl_s else None
    return vllm_flag_advice(spec_advice.recommendations(by_task), spec_speedup.summary_by_task(by_task),
                            ttft[keep], itl[keep], slo, peak, config.seq_candidates)


def decisions_document(part: AutoApplyPart | None, state: AgentState, config: AutoApplyConfig,
                       rings: list[str], vllm_url: str | None, limit: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"auto_apply": "on" if part is not None else "off", "knobs": list(config.knobs)}
    if part is not None:
        doc.update(part.decisions.document(limit))
        doc["engine_takes_policy"] = part.writer.writable
        if part.speculation is not None:  # a task the loop disabled gets a canary with speculation on this often
            doc["recheck_s"] = config.recheck_s
    else:
        doc.update({k: v for k, v in loop_off_document(limit).items() if k not in doc})
    if vllm_url or any(r.startswith(VLLM_RING_PREFIX) for r in rings) or (rings and not _takes_policy(part, rings)):
        doc["vllm"] = vllm_document(state, config)
    return doc


def _takes_policy(part: AutoApplyPart | None, rings: list[str]) -> bool:
    """Whether an engine the agent reads has a run-time policy region (ours); vLLM's rings have no
    control block at all."""
    if part is not None:
        return part.writer.writable
    probe = PolicyWriter(lambda: rings)
    try:
        return probe.writable
    finally:
        probe.close()


def decision_routes(document: Callable[[int], dict[str, Any]]) -> list[Route]:
    """document(limit): decisions_document with the agent's parts bound (agent.service)."""
    async def decisions(request: Request) -> Response:
        raw = request.query_params.get("limit", "100")
        if not raw.isdigit() or not 0 <= int(raw) <= 1000:
            return JSONResponse({"error": f"limit must be an integer in 0..1000, got {raw[:40]!r}"}, status_code=400)
        return JSONResponse(document(int(raw)))

    return [Route("/api/v1/decisions", decisions)]


def loop_off_document(limit: int) -> dict[str, Any]:
    """GET /api/v1/decisions of an app built without the loop (agent.api.server.build_app's default)."""
    return {"auto_apply": "off", "knobs": [], "decisions": [], "counts": {}, "in_force": {}, "in_flight": {}}
