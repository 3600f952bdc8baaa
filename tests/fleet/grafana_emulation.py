"""What Grafana does to a generated dashboard's queries before and after Prometheus answers, for
tests that ask a real Prometheus without running Grafana:

- template variables substituted as Grafana's Prometheus datasource does (public/app/plugins/
  datasource/prometheus: interpolateQueryExpr): a multi-value or include-all variable's values are
  regex-escaped (prometheusSpecialRegexEscape) and, when more than one, joined as (a|b); "All" is
  the variable's allValue; the built-ins ($__rate_interval, $__range, ...) by the given window;
- a table panel's merge / sortBy / organize transformations, on instant table-format answers:
  rows merged on their labels, sorted by the sort field.
"""
from __future__ import annotations

import re
from collections.abc import Callable

#: prometheusSpecialRegexEscape: each of these gets a backslash (written doubled in the PromQL string).
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")
ALL = None  # a selection of "All"


def grafana_value(values: list[str] | None, all_value: str) -> str:
    """One variable's text in a query: allValue for "All", else the escaped values (a|b joined)."""
    if values is None:
        return all_value
    escaped = [_REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), v.replace("\\", "\\\\\\\\")) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: list[dict], selection: dict[str, list[str]], window: str) -> str:
    """expr with every variable of the dashboard (its templating list) filled in: those in selection by
    their values, the others at "All"; the built-ins by window ($__interval by 15s)."""
    for name, value in {"__rate_interval": window, "__interval": "15s", "__range": window}.items():
        expr = re.sub(r"\$\{?" + name + r"\}?", value, expr)
    for var in variables:
        if var["type"] == "datasource":
            continue
        value = grafana_value(selection.get(var["name"], ALL), var.get("allValue") or ".*")
        expr = re.sub(r"\$\{" + var["name"] + r"(?::\w+)?\}|\$" + var["name"] + r"\b|\[\[" + var["name"] + r"\]\]",
                      lambda _m: value, expr)
    assert "$" not in expr, expr
    return expr


def table_rows(panel: dict, run: Callable[[str], list[dict]], fill: Callable[[str], str]) -> list[dict[str, object]]:
    """The rows a table panel shows: each target (instant, table format) run after fill (the
    substitution), the answers merged on their labels (merge), sorted (sortBy), columns renamed
    (organize). A row: its labels and each column's value as a float."""
    transforms = {t["id"]: t["options"] for t in panel["transformations"]}
    assert list(transforms)[:1] == ["merge"], transforms
    rows: dict[tuple, dict[str, object]] = {}
    for target in panel["targets"]:
        assert target["format"] == "table" and target["instant"], target
        for series in run(fill(target["expr"])):
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            row = rows.setdefault(tuple(sorted(labels.items())), dict(labels))
            row[f"Value #{target['refId']}"] = float(series["value"][1])
    out = list(rows.values())
    for sort in reversed(transforms.get("sortBy", {}).get("sort", [])):
        out.sort(key=lambda r: r.get(sort["field"], float("-inf")), reverse=bool(sort.get("desc")))
    renamed = transforms.get("organize", {}).get("renameByName", {})
    return [{renamed.get(k, k): v for k, v in r.items()} for r in out]
