"""One finished request explained, for GET /api/v1/requests/{id}: its row (the decomposition, the
TTFT parts, the cause and its numbers), the engine steps it was in (those the agent still holds),
its kernel time from a capture when one covered it, and how each figure was obtained.

Reads the kept rows (--retention-mib) and the recent batch/step frames; None when the request is
not among the kept rows (finished long ago, never seen, or not finished yet).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from infersight.agent.energy_summary import BASIS as ENERGY_BASIS
from infersight.agent.rows.finished_rows import row_dicts
from infersight.agent.api.report import _clean
from infersight.agent.state import AgentState
from infersight.correlate.requests import REQUEST_FIELDS

#: Engine steps listed per request (a long request's first and last ones are kept).
MAX_STEPS_LISTED = 256

#: How each figure of the document was obtained (the agent's words, as in the Parquet column docs).
BASES = {
    "queue_s": "measured: probe timestamps (arrival -> first scheduled), engine monotonic clock",
    "prefill_s": "measured: probe timestamps (first scheduled -> first token, less the preemption stalls inside)",
    "preemption_stall_s": "measured: probe timestamps (preempted -> resumed)",
    "decode_s": "measured: probe timestamps (first token -> finish, less the preemption stalls inside)",
    "network_s": "measured: `infersight serve`'s receive and last-byte timestamps (0 when not served over HTTP)",
    "ttft_s": "measured: arrival (or the HTTP body's receipt) -> first token",
    "e2e_s": "measured: arrival -> finish (+ network)",
    "itl_mean_s": "measured: mean gap between emitted tokens",
    "engine_seconds": "modelled: the request's token share of its engine steps' wall-clock time (host work "
                      "included; not GPU time)",
    "energy_j": ENERGY_BASIS + " (null without a GPU energy counter)",
    "energy_dynamic_j": ENERGY_BASIS + ": the part of energy_j on its tokens (dynamic joules per token fitted on "
                        "the counter's intervals; null for a request split before that fit was usable)",
    "energy_static_j": ENERGY_BASIS + ": energy_j - energy_dynamic_j, its share of the GPU's static draw in its "
                       "steps (fitted static watts x step time), in proportion to its dynamic cost",
    "gpu_kernel_s": "measured: GPU kernel time of a profiler capture, split over the step's requests by tokens "
                    "(null when no capture covered the request)",
    "steps": "measured: the engine's STEP and BATCH probe records (wall-clock step duration, tokens fed)",
    "slow_cause": "modelled: the slow-request attribution's rule over the measured parts (correlate.slow_causes)",
}


def _wall_s(state: AgentState, mono_ns: Any) -> float | None:
    if mono_ns is None or mono_ns != mono_ns or int(mono_ns) < 0:
        return None
    wall, mono = state.wall_anchor
    return (wall + int(mono_ns) - mono) / 1e9


def _steps_of(state: AgentState, request_id: int) -> tuple[list[dict[str, Any]], int]:
    """The held steps the request was in, oldest first: (at most MAX_STEPS_LISTED of them, how many held)."""
    batch, steps = state.recent_batch_frame(), state.recent_steps_frame()
    mine = batch[batch["request_id"].to_numpy(np.int64) == request_id]
    if mine.empty:
        return [], 0
    mine = mine.drop_duplicates("step_id")
    joined = mine.merge(steps, on="step_id", how="left", suffixes=("", "_step")).sort_values("step_id")
    n = len(joined)
    if n > MAX_STEPS_LISTED:
        half = MAX_STEPS_LISTED // 2
        joined = pd.concat([joined.iloc[:half], joined.iloc[-half:]])
    out = []
    for r in joined.itertuples(index=False):
        has_step = r.start_ns == r.start_ns  # NaN: the step record is no longer held
        out.append({"step_id": int(r.step_id), "tokens_fed": int(r.num_tokens),
                    "duration_s": (r.end_ns - r.start_ns) / 1e9 if has_step else None,
                    "batch_size": int(r.batch_size) if has_step else None,
                    "prefill_tokens": int(r.prefill_tokens) if has_step else None,
                    "decode_tokens": int(r.decode_tokens) if has_step else None,
                    "spec_tokens": int(r.spec_tokens) if has_step else None,
                    "preempted": int(r.preempted) if has_step else None})
    return out, n


def explain_request(state: AgentState, request_id: int) -> dict[str, Any] | None:
    with state.lock:
        kept = state.finished.frame()
        kernels = state.kernel_by_request.get(request_id)
    if kept.empty:
        return None
    hit = kept[kept["request_id"].to_numpy(np.int64) == request_id]
    if hit.empty:
        return None
    row = row_dicts(hit.iloc[-1:])[0]
    steps, held = _steps_of(state, request_id)
    doc = {k: row.get(k) for k in REQUEST_FIELDS}
    if kernels is not None:
        doc["gpu_kernel_s"] = float(kernels["kernel_ns"]) / 1e9  # type: ignore[arg-type]
    doc.update({
        "slow_detail": row.get("slow_detail", ""),
        "ttft_parts_s": {"queue_s": row.get("queue_s"), "prefill_s": row.get("prefill_s"),
                         "stall_and_network_before_first_token_s": None},
        "arrival_wall_s": _wall_s(state, row.get("arrival_ns")),
        "first_token_wall_s": _wall_s(state, row.get("first_token_ns")),
        "finish_wall_s": _wall_s(state, row.get("finish_ns")),
        "energy_basis": ENERGY_BASIS if row.get("energy_j") == row.get("energy_j") else None,
        "steps": steps, "steps_held": held,
        "kernels": kernels,  # {"kernel_ns", "top": [...]} from a capture, or None
        "bases": BASES,
    })
    # TTFT = queue + prefill + the stalls before the first token + the network lead (correlate.requests).
    q, p, t = row.get("queue_s"), row.get("prefill_s"), row.get("ttft_s")
    if all(isinstance(v, float) and v == v for v in (q, p, t)):
        doc["ttft_parts_s"]["stall_and_network_before_first_token_s"] = max(0.0, t - q - p)  # type: ignore[operator]
    return _clean(doc)
