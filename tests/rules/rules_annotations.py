"""The annotations promtool must see on a firing alert: the generated rule's templates rendered with
the alert's hand-written labels and its hand-computed value. Only the template forms the rules use
are understood; anything else fails the test, so a new form gets a renderer (and a check) first."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")


def _render_one(expr: str, labels: dict[str, str], value: float | None) -> str:
    if m := re.fullmatch(r"\$labels\.(\w+)", expr):
        return labels.get(m.group(1), "")  # Prometheus prints a missing label as ""
    assert value is not None, f"template {expr!r} needs the alert's value"
    if expr == "$value":  # Go's %v of a float64: used here for integral values only
        assert value == int(value), f"bare $value for a non-integer {value}"
        return str(int(value))
    if m := re.fullmatch(r'\$value \| printf "%\.(\d)g"', expr):
        return f"%.{m.group(1)}g" % value
    if expr == "$value | humanizePercentage":
        return "%.4g%%" % (value * 100)
    raise AssertionError(f"no renderer for template {{{{ {expr} }}}}")


def render(text: str, labels: dict[str, str], value: float | None) -> str:
    return TEMPLATE.sub(lambda m: _render_one(m.group(1), labels, value), text)


def load_alerts(*paths: Path) -> list[dict]:
    return [rule for p in paths for group in yaml.safe_load(p.read_text())["groups"] for rule in group["rules"]
            if "alert" in rule]


def find_alert(alerts: list[dict], name: str, **labels: str) -> dict:
    found = [a for a in alerts if a["alert"] == name and all(a["labels"].get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{len(found)} rules named {name} with {labels}"
    return found[0]


def expected(rule: dict, series_labels: dict[str, str], value: float | None) -> dict:
    """exp_labels (the rule's own labels over the series') and exp_annotations for promtool."""
    labels = {**series_labels, **rule["labels"]}
    return {"exp_labels": labels,
            "exp_annotations": {k: render(v, labels, value) for k, v in rule["annotations"].items()}}
