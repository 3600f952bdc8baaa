"""One capture -> a JSON-able report (breakdowns, roofline, findings) and its text rendering.

Report keys: source (kineto | nsys | ncu), path, devices, has_timeline, meta (producer versions),
kernels {count, total_ns} (raw category "kernel" only), gpu_activity {count, total_ns, busy_ns,
span_ns} (kernels, copies and memsets), categories [{name, count, total_ns, share}], phases
[phase_breakdown rows], ranges [{name, count, kernel_ns, share}] (kernel time by enclosing range
name), streams [idle_gaps rows], top_kernels [...], roofline [{phase, op_category, ...}] (only
with a model and step shapes, or a capture's shapes file: phase "captured"; for ncu with DRAM
metrics, also measured_bytes and model_error), ceilings (kernels.ceilings.ceiling_lookup.CeilingLookup.
as_dict: the peaks and each one's source, measured / datasheet / given, or known: false and why),
findings [{severity, text, action}]. Shares are of all GPU time.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from infersight.kernels.analysis import findings as rules
from infersight.kernels.analysis.attribution import kernel_time_by_range
from infersight.kernels.analysis.categories import classify
from infersight.kernels.ceilings.ceiling_lookup import CeilingLookup, CeilingQuery
from infersight.kernels.ceilings.device_ceilings import dtype_name_for_bytes, rate_text
from infersight.kernels.frames import KernelTrace
from infersight.kernels.analysis.roofline import (
    DeviceCeilings, StepShape, measured_dram_bytes, roofline_for_phase, roofline_for_steps, with_measured_bytes,
)
from infersight.kernels.readers.shapes import CaptureShapes, engine_step_ids
from infersight.kernels.analysis.step_findings import bandwidth_finding, graph_launch_share, outside_step_findings
from infersight.kernels.analysis.timeline import category_breakdown, idle_gaps, phase_breakdown, top_kernels


def _plain(value: Any) -> Any:
    """numpy / pandas scalars -> Python; NaN and NA -> None."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-able dicts."""
    return [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def _ceilings(trace: KernelTrace, ceilings: DeviceCeilings | CeilingQuery, shapes: Sequence[StepShape],
              captured: CaptureShapes | None) -> CeilingLookup:
    """The capture's ceilings: given as DeviceCeilings, or looked up for its device and dtype."""
    dtype_bytes = captured.dtype_bytes if captured is not None else shapes[0].dtype_bytes if shapes else 2
    dtype = dtype_name_for_bytes(dtype_bytes)
    if isinstance(ceilings, DeviceCeilings):
        return CeilingLookup(ceilings.name, dtype, ceilings)
    return ceilings.lookup(trace.devices, dtype)


def build_report(trace: KernelTrace, model: Any = None, shapes: Sequence[StepShape] = (),
                 ceilings: DeviceCeilings | CeilingQuery = CeilingQuery(), top: int = 10,
                 captured: CaptureShapes | None = None,
                 outside_step_ns: dict[str, float] | None = None) -> dict[str, Any]:
    """The report for one capture. model: a ModelConfig (only needed with shapes, uniform steps
    given by hand). ceilings: the roofline's, or a query that looks them up for the capture's
    device (kernels.ceilings.ceiling_lookup; default: measured, else datasheet, else none). captured: the
    capture's shapes file, which models every captured step as it was (roofline rows with phase
    "captured"). For an ncu capture with DRAM metrics, roofline rows also carry measured_bytes and
    model_error. outside_step_ns: the engine's own step time by phase outside the capture (its STEP
    records); gaps of a capture that slowed its steps are judged against it (kernels.analysis.step_findings)."""
    lookup = _ceilings(trace, ceilings, shapes, captured)
    used = lookup.ceilings
    k = classify(trace.kernels)
    only_kernels = k[k["category"] == "kernel"]
    categories = category_breakdown(k)
    phases = phase_breakdown(k)
    streams = idle_gaps(trace.kernels)
    if not trace.has_timeline:  # ncu's back-to-back placement has no gaps to report
        phases = phases.assign(window_ns=0, busy_ns=0, idle_ns=0, idle_share=0.0)
        streams = streams.iloc[0:0]
    device_rows = streams[streams["stream"] == -1]
    tops = top_kernels(k, top)
    roof_parts = []
    graph_share = graph_launch_share(trace.runtime, trace.kernels)
    outside, replaced = outside_step_findings(phases, outside_step_ns or {}, graph_share >= 0.5)
    found: list[rules.Finding] = outside + [
        dataclasses.replace(f, action=rules.GRAPH_REPLAY_ACTION) if graph_share >= 0.5 else f
        for f in rules.launch_findings(phases[~phases["phase"].isin(replaced)], trace.has_timeline)]
    found += rules.category_findings(categories, k)
    placements = []
    if captured is not None:
        aligned = engine_step_ids(k, trace.ranges, captured.first_step)
        placements.append(("captured", "", roofline_for_steps(aligned, captured.model, captured.steps,
                                                              captured.dtype_bytes, used)))
    if model is not None:
        placements += [(s.phase, s.phase, roofline_for_phase(k, model, s, used)) for s in shapes]
    measured = measured_dram_bytes(k, trace.metrics)  # empty unless ncu collected DRAM counters
    for phase, label, placed in placements:
        if not measured.empty:
            placed = with_measured_bytes(placed, measured)
            found += rules.byte_model_findings(placed)
        if used is not None:  # with no ceiling known there is no roof to fall short of
            found += rules.roofline_findings(placed, label, used)
        if used is not None and phase == "captured" and captured is not None \
                and (captured.steps["phase"] == "decode").all():
            found += bandwidth_finding(placed, int(captured.steps["step_id"].nunique()), used.peak_gbps,
                                       (outside_step_ns or {}).get("decode"), used.gbps_source)
        roof_parts.append(placed.assign(phase=phase))
    if trace.kind == "ncu":  # one profiled kernel "taking all the time" says nothing
        found += rules.sol_findings(trace.metrics) + rules.ncu_findings(trace.rules)
    else:
        found += rules.top_kernel_findings(tops) + rules.range_findings(trace.kernels)
    roofline = pd.concat(roof_parts, ignore_index=True) if roof_parts else pd.DataFrame()
    return {
        "source": trace.kind, "path": trace.path, "devices": list(trace.devices),
        "has_timeline": trace.has_timeline, "meta": dict(trace.meta),
        "kernels": {"count": int(len(only_kernels)), "total_ns": int(only_kernels["dur_ns"].sum())},
        "gpu_activity": {"count": int(len(k)), "total_ns": int(k["dur_ns"].sum()),
                         "busy_ns": int(device_rows["busy_ns"].sum()), "span_ns": int(device_rows["span_ns"].sum())},
        "categories": [{"name": r["op_category"], "count": r["count"], "total_ns": r["total_ns"], "share": r["share"]}
                       for r in records(categories)],
        "phases": records(phases),
        "ranges": records(kernel_time_by_range(k, trace.ranges)),
        "streams": records(streams),
        "top_kernels": records(tops),
        "roofline": records(roofline),
        "ceilings": lookup.as_dict(),
        "graph_launch_share": graph_share, "outside_step_ns": dict(outside_step_ns or {}),
        "findings": [f.as_dict() for f in rules.sort_findings(found)],
    }


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def ceilings_lines(c: dict[str, Any]) -> list[str]:
    """The roofline's header: the ceilings and where each came from, or why there are none."""
    if not c.get("known", True):
        return [f"roofline (modelled work over measured kernel time): {c['note']}"]
    lines = [f"roofline vs {c['name']} (modelled work over measured kernel time):"]
    for value, unit, source in ((rate_text(c["peak_tflops"]), "TFLOP/s", c.get("tflops_source")),
                                (rate_text(c["peak_gbps"]), "GB/s", c.get("gbps_source"))):
        said = f"{source['kind']}: {source['detail']}" if source else "source not recorded"
        lines.append(f"  {value} {unit}, {said}")
    return lines


def render_text(report: dict[str, Any], max_ranges: int = 15) -> str:
    """The report for people: totals, categories, phases, ranges, top kernels, roofline, findings."""
    out = [f"{report['source']} capture: {report['path']}"]
    if report["devices"]:
        out.append(f"devices: {', '.join(sorted(set(report['devices'])))}")
    ka, ga = report["kernels"], report["gpu_activity"]
    out.append(f"kernels: {ka['count']} ({_ms(ka['total_ns'])}); all GPU activity: {ga['count']} "
               f"({_ms(ga['total_ns'])})")
    if report["has_timeline"] and ga["span_ns"]:
        out.append(f"GPU busy {_ms(ga['busy_ns'])} of a {_ms(ga['span_ns'])} span "
                   f"({100 * ga['busy_ns'] / ga['span_ns']:.1f}%)")
    else:
        out.append("no timeline (ncu replays kernels one by one): gaps and phases are not measured")
    out += ["", "category                 count        time   share"]
    out += [f"{c['name']:<20} {c['count']:>9} {_ms(c['total_ns']):>14} {100 * c['share']:>6.1f}%"
            for c in report["categories"]]
    if report["phases"] and report["has_timeline"]:
        out += ["", "phase                steps  kernels        time   share   idle in window"]
        out += [f"{_short(p['phase'], 20):<20} {p['steps']:>5} {p['activities']:>8} {_ms(p['kernel_ns']):>14} "
                f"{100 * p['share']:>6.1f}%   {100 * p['idle_share']:>5.1f}%" for p in report["phases"]]
    if report["ranges"]:
        out += ["", "range                                      count        time   share"]
        out += [f"{_short(r['name'], 40):<40} {r['count']:>7} {_ms(r['kernel_ns']):>14} {100 * r['share']:>6.1f}%"
                for r in report["ranges"][:max_ranges]]
    out += ["", "top kernels                                                    count        time   share"]
    out += [f"{_short(t['name']):<60} {t['count']:>7} {_ms(t['total_ns']):>14} {100 * t['share']:>6.1f}%"
            for t in report["top_kernels"]]
    if report["roofline"]:
        out += ["", *ceilings_lines(report["ceilings"]),
                "phase    category             FLOP/B  TFLOP/s     GB/s  bound    of roof"]
        out += [f"{r['phase']:<8} {r['op_category']:<18} {r['intensity'] or 0:>8.1f} {r['achieved_tflops']:>8.2f} "
                f"{r['achieved_gbps']:>8.1f}  {r['bound']:<8} "
                + (f"{100 * r['pct_of_roof']:>6.1f}%" if r["pct_of_roof"] is not None else "    n/a")
                for r in report["roofline"]]
        measured = [r for r in report["roofline"] if r.get("measured_bytes") is not None]
        if measured:
            out += ["", "bytes: modelled vs measured (ncu DRAM read + write)",
                    "phase    category            modelled GB  measured GB   model error"]
            out += [f"{r['phase']:<8} {r['op_category']:<18} {r['bytes'] / 1e9:>12.4f} {r['measured_bytes'] / 1e9:>12.4f}"
                    f" {100 * r['model_error']:>+12.1f}%" for r in measured]
    out += ["", "findings:" if report["findings"] else "findings: none"]
    out += [f"  [{f['severity']}] {f['text']}\n      -> {f['action']}" for f in report["findings"]]
    return "\n".join(out)
