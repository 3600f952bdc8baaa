"""The demo summary's flight-recorder rows: what the recorder sampled and cost against its budget,
and where the sampled op categories sit on the roofline, each share naming the ceiling it was placed
against and where that ceiling came from (measured, datasheet or given).

Read from one snapshot of the agent's exposition (the demo's metrics.prom), as the dashboards see
it: the summary, fetched a moment earlier, may predate a window's measured cost.
"""
from __future__ import annotations

from collections import defaultdict
from prometheus_client.parser import text_string_to_metric_families

from infersight.exporters import catalogue as C


def exposition_samples(metrics: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of a Prometheus text exposition."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return out


def _ceiling(samples: dict[str, list[tuple[dict[str, str], float]]]) -> str:
    """"CPU X (compute measured, bandwidth measured)": the roof the shares were placed against."""
    peaks = {what: samples.get(spec.sample, []) for what, spec in (("compute", C.KERNEL_PEAK_FLOPS),
                                                                   ("bandwidth", C.KERNEL_PEAK_BYTES))}
    if not all(peaks.values()):
        return "no ceiling known"
    names = sorted({labels["ceiling"] for rows in peaks.values() for labels, _ in rows})
    sources = ", ".join(f"{what} {rows[0][0]['source']}" for what, rows in peaks.items())
    return f"{' / '.join(names)} ({sources})"


def _value(samples: dict[str, list[tuple[dict[str, str], float]]], spec: C.MetricSpec) -> float | None:
    rows = samples.get(spec.sample, [])
    return rows[0][1] if rows else None


def recorder_rows(metrics: str | None) -> list[tuple[str, str]]:
    """(row name, text) rows; none when the agent ran without the recorder (no budget gauge)."""
    samples = exposition_samples(metrics) if metrics else {}
    budget, cost = _value(samples, C.RECORDER_BUDGET), _value(samples, C.RECORDER_COST_RATIO)
    if budget is None:
        return []
    windows = {labels["outcome"]: int(v) for labels, v in samples.get(C.RECORDER_WINDOWS.sample, [])}
    triggered = [labels["reason"] for labels, v in samples.get(C.RECORDER_TRIGGERED.sample, []) if v > 0]
    spent = f"cost {cost:.2%} of engine time" if cost is not None else "cost not reported"
    rows = [("flight recorder", f"{windows.get('analysed', 0)} windows analysed, {windows.get('failed', 0)} failed; "
                                f"{spent}, measured from step times (budget {budget:.2%}); triggered captures: "
                                + (", ".join(triggered) or "none"))]
    fractions = sorted(((labels["category"], v) for labels, v in samples.get(C.KERNEL_ROOF_FRACTION.sample, [])),
                       key=lambda cv: -cv[1])
    if fractions:
        shares = ", ".join(f"{category} {v:.1%}" for category, v in fractions)
        rows.append(("roofline (sampled)", f"{shares} of the roof of {_ceiling(samples)}"))
    else:
        rows.append(("roofline (sampled)", f"no window placed on a roofline ({_ceiling(samples)})"))
    return rows
