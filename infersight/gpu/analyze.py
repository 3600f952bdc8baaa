"""`infersight analyze FILE` for Prometheus / dcgm-exporter text: what GPUs, what values, what is off.

`analyze_exposition(text)` returns a plain dict (JSON-ready):
    source     "dcgm-exporter" when any DCGM_* series is present, else "prometheus"
    scheme     "legacy" (dcgm-exporter < 4.9 names and units), "4.9", "mixed", or "" (no mapped series)
    hostname_label  "Hostname" (exporter < 4.8.3) / "hostname" / "" as spelled in the file
    gpus       [{gpu, uuid, instance, profile, model, hostname, driver, pci_bus_id}]  (instance: MIG GPU_I_ID)
    samples    [{gpu, uuid, instance, field, value, unit}]  values converted to base units
    unmapped   DCGM metric names present but not mapped to an infersight field
    warnings   human sentences: unparseable text, dropped DCGM blanks, ratios above 1, ...
`format_exposition_table(result)` renders it for a terminal. The `infersight analyze` command
(owned elsewhere) calls these two for Prometheus text files.
"""
from __future__ import annotations

import io
from dataclasses import asdict
from typing import Any

from infersight.gpu.exporter_text import ParsedExposition, parse_exposition
from infersight.gpu.fields import unit_of

RATIO_SLACK = 1.0 + 1e-6  # DCGM ratios can print as 1.000001 after float formatting


def _scheme(parsed: ParsedExposition) -> str:
    if len(parsed.schemes) > 1:
        return "mixed"
    return next(iter(parsed.schemes), "")


def _warnings(parsed: ParsedExposition) -> list[str]:
    out = [f"dropped DCGM blank value ({b.meaning}): {b.name} gpu {b.gpu}"
           f"{' MIG ' + b.instance if b.instance else ''} = {b.value:.17g}" for b in parsed.blanks]
    if parsed.no_gpu_label:
        out.append(f"{parsed.no_gpu_label} DCGM series without a numeric `gpu` label were skipped")
    if parsed.unreadable_values:
        out.append(f"{parsed.unreadable_values} DCGM samples with a value too large for a float were skipped")
    if len(parsed.schemes) > 1:
        out.append("both pre-4.9 and 4.9 dcgm-exporter names are present; each was converted with its own units")
    if len(parsed.hostname_labels) > 1:
        out.append("both `Hostname` and `hostname` labels are present (exporters before and after 4.8.3 mixed?)")
    for s in parsed.samples:
        if unit_of(s.field) == "ratio" and s.value > RATIO_SLACK:
            out.append(f"{s.field} on gpu {s.gpu} is {s.value:g}, above 1: a percentage exported under a ratio name?")
    return out


def analyze_exposition(text: str) -> dict[str, Any]:
    """Parse Prometheus exposition text and summarise its GPU content; never raises on bad text
    (a file that does not parse yields an empty result with the parser's complaint as a warning)."""
    try:
        parsed = parse_exposition(text, 0)
    except ValueError as e:
        return {"source": "prometheus", "scheme": "", "hostname_label": "", "gpus": [], "samples": [],
                "unmapped": [], "warnings": [f"not valid Prometheus text: {e}"]}
    warnings = _warnings(parsed)
    if parsed.dcgm_series == 0:
        warnings.append("no DCGM series: no GPU telemetry in this file")
    return {
        "source": "dcgm-exporter" if parsed.dcgm_series else "prometheus",
        "scheme": _scheme(parsed),
        "hostname_label": next(iter(sorted(parsed.hostname_labels)), ""),
        "gpus": [asdict(g) for _, g in sorted(parsed.gpus.items())],
        "samples": [{"gpu": s.gpu, "uuid": s.uuid, "instance": s.instance, "field": s.field, "value": s.value,
                     "unit": unit_of(s.field)} for s in parsed.samples],
        "unmapped": sorted(parsed.unmapped),
        "warnings": warnings,
    }


def _human(value: float, unit: str) -> str:
    """A readable rendering next to the exact base-unit value."""
    if unit == "ratio":
        return f"{value * 100:.1f} %"
    if unit in ("bytes", "bytes_per_second"):
        size, suffix = value, "B"
        for prefix in ("Ki", "Mi", "Gi", "Ti"):
            if abs(size) < 1024:
                break
            size, suffix = size / 1024, prefix + "B"
        return f"{size:.1f} {suffix}" + ("/s" if unit == "bytes_per_second" else "")
    if unit == "hertz":
        return f"{value / 1e6:g} MHz"
    return f"{value:g} {dict(watts='W', joules='J', celsius='°C').get(unit, unit)}"


def format_exposition_table(result: dict[str, Any], width: int = 110) -> str:
    """The analysis as text: one line per GPU, a table of converted values, then the warnings."""
    from rich.console import Console  # only the CLI renders tables: the agent imports this module too
    from rich.table import Table

    # markup off: metric names and label values may contain brackets rich would read as markup
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, markup=False,
                      highlight=False)
    console.print(f"source: {result['source']}" + (f", dcgm-exporter naming: {result['scheme']}"
                                                    if result.get("scheme") else ""))
    for g in result["gpus"]:
        where = f" MIG {g['profile'] or ''} GPU_I_ID={g['instance']}" if g["instance"] else ""
        console.print(f"gpu {g['gpu']}{where}: {g['uuid'] or '?'} {g['model']} host={g['hostname'] or '?'}"
                      f" driver={g['driver'] or '?'}")
    if result["samples"]:
        table = Table(show_edge=False, pad_edge=False)
        for col, justify in (("gpu", "right"), ("mig", "left"), ("field", "left"), ("value", "right"),
                             ("unit", "left"), ("≈", "right")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for s in result["samples"]:
            table.add_row(str(s["gpu"]), s["instance"], s["field"], f"{s['value']:.6g}", s["unit"],
                          _human(s["value"], s["unit"]))
        console.print(table)
    if result.get("unmapped"):
        console.print(f"not mapped ({len(result['unmapped'])}): {', '.join(result['unmapped'])}")
    for w in result["warnings"]:
        console.print(f"warning: {w}")
    return console.file.getvalue()  # type: ignore[attr-defined]
