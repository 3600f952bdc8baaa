"""Findings about a decode step as the engine runs it, not as the profiler saw it.

A capture slows what it records: torch.profiler adds host time to every op, and an engine that
replays CUDA graphs may run the captured steps eagerly (for per-layer ranges). Its kernels are the
same ones, so their busy time per step still holds; the gaps between them do not. When the
engine's own step time outside the capture is known (`outside_step_ns`, from its STEP records),
the gaps are judged against that step instead:

    idle share outside = 1 - (kernel busy time per captured step) / (step time outside the capture)

and the "launch-bound" finding of the capture's phase is replaced by one that says what the step
outside looks like. When the kernels came from CUDA-graph replays (cudaGraphLaunch in the
trace), gaps are host work between replays, not launches, and the action says so.

The bandwidth finding adds up the memory-bound roofline rows of the captured steps (GEMM and
decode attention, modelled bytes from the shapes file over measured kernel time): the share of
the memory roof the step's kernels reach while they run, and per step outside the capture.
"""
from __future__ import annotations

import pandas as pd

from infersight.kernels.ceilings.device_ceilings import CeilingSource
from infersight.kernels.analysis.findings import GRAPH_REPLAY_ACTION, LAUNCH_BOUND_HIGH, LAUNCH_BOUND_MEDIUM, MIN_PHASE_SHARE, Finding, _pct

#: A captured step this many times slower than outside the capture was distorted by the capture.
DISTORTED = 1.5
_GRAPH_LAUNCH = "cudaGraphLaunch"


def graph_launch_share(runtime: pd.DataFrame, kernels: pd.DataFrame) -> float:
    """Share of the kernels launched by a CUDA-graph replay (cudaGraphLaunch's correlation ids)."""
    if kernels.empty or runtime.empty:
        return 0.0
    graph_ids = runtime.loc[runtime["name"].str.startswith(_GRAPH_LAUNCH), "correlation"]
    only = kernels[kernels["category"] == "kernel"]
    return float(only["correlation"].isin(graph_ids).mean()) if len(only) else 0.0


def _host_action(graphs: bool) -> str:
    if graphs:
        return GRAPH_REPLAY_ACTION
    return ("the host's per-step work runs in series with the GPU: overlap the next step's scheduling, inputs and "
            "sampling with this step's GPU work (async scheduling, as in vLLM); run decode as CUDA graphs if it "
            "does not yet, and fuse small kernels")


def outside_step_findings(phases: pd.DataFrame, outside_step_ns: dict[str, float], graphs: bool
                          ) -> tuple[list[Finding], set[str]]:
    """(findings, phases they replace the launch finding of). One per phase whose captured steps
    ran DISTORTED times slower than the engine's own steps: the idle share judged outside."""
    out: list[Finding] = []
    replaced: set[str] = set()
    for row in phases.itertuples(index=False):
        outside = outside_step_ns.get(row.phase)
        if not outside or not row.steps or row.window_ns <= 0 or row.share < MIN_PHASE_SHARE:
            continue
        captured = row.window_ns / row.steps
        if captured < DISTORTED * outside:
            continue
        replaced.add(row.phase)
        busy = row.busy_ns / row.steps
        idle = max(0.0, 1.0 - busy / outside)
        said = (f"{row.phase}: outside the capture a step takes {outside / 1e6:.2f} ms, its kernels {busy / 1e6:.2f} ms "
                f"(the captured steps took {captured / 1e6:.2f} ms: the profiler slows the host"
                f"{'' if graphs else ', and an engine with CUDA graphs runs profiled steps eagerly'})")
        if idle < LAUNCH_BOUND_MEDIUM:
            out.append(Finding("info", f"{said}: the GPU is busy {_pct(1 - idle)} of the step",
                               "the step is GPU-bound: see the roofline findings for its kernels"))
        else:
            severity = "high" if idle >= LAUNCH_BOUND_HIGH else "medium"
            out.append(Finding(severity, f"{said}: the GPU idles {_pct(idle)} of the step", _host_action(graphs)))
    return out, replaced


def bandwidth_finding(roofline: pd.DataFrame, captured_steps: int, peak_gbps: float,
                      outside_step_ns: float | None, source: CeilingSource | None = None) -> list[Finding]:
    """The memory-bound rows of the captured steps together: bytes per step, their rate while the
    kernels run against the memory roof, and (when known) per step time outside the capture.
    source: where peak_gbps came from (kernels.ceilings.device_ceilings), named in the text."""
    rows = roofline[(roofline["bound"] == "memory") & (roofline["kernel_ns"] > 0)] if not roofline.empty else roofline
    if rows.empty or captured_steps <= 0:
        return []
    total_bytes, total_ns = float(rows["bytes"].sum()), float(rows["kernel_ns"].sum())
    gbps = total_bytes / total_ns
    per_step = total_bytes / captured_steps
    parts = ", ".join(f"{r.op_category} {_pct(r.pct_of_peak_bw)}" for r in rows.itertuples(index=False))
    text = (f"decode is memory-bound: its kernels ({', '.join(rows['op_category'])}) move {per_step / 1e9:.2f} GB "
            f"per step at {gbps:,.0f} GB/s while they run, {_pct(gbps / peak_gbps)} of the {peak_gbps:,.0f} GB/s "
            f"memory roof{f' ({source.kind})' if source else ''} ({parts})")
    if outside_step_ns:
        text += (f"; over the whole {outside_step_ns / 1e6:.2f} ms step outside the capture, "
                 f"{_pct(per_step / outside_step_ns / peak_gbps)} of it")
    severity = "info" if gbps / peak_gbps >= 0.5 else "medium"
    return [Finding(severity, text, "the step's floor is its bytes: fewer bytes per token (a larger batch per weight "
                                    "read, quantized weights or KV) lowers it; kernels below the roof are named above")]


def outside_step_times(steps: pd.DataFrame, first_step: int, last: int = 64) -> dict[str, float]:
    """Median duration of the engine's last `last` pure-decode steps before `first_step` (STEP
    records: step_id, start_ns, end_ns, prefill_tokens, decode_tokens), as {"decode": ns}; {} when
    fewer than 3 are known."""
    if steps.empty:
        return {}
    before = steps[(steps["step_id"] < first_step) & (steps["prefill_tokens"] == 0) & (steps["decode_tokens"] > 0)]
    before = before.drop_duplicates("step_id").sort_values("step_id").tail(last)
    if len(before) < 3:
        return {}
    return {"decode": float((before["end_ns"] - before["start_ns"]).median())}
