"""The rule model: a recording rule, an alerting rule and a group, each rendered to the plain
dict Prometheus' rule-file format (and prometheus-operator's PrometheusRule spec) reads."""
from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Recording:
    """`record: level:metric:operations` (Prometheus' naming practice for recording rules)."""

    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.record.count(":") != 2:
            raise ValueError(f"a recording rule is named level:metric:operations, got {self.record!r}")

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclass(frozen=True)
class Alert:
    """An alerting rule. Every alert carries a severity, a summary, a description with the numbers
    (`$value`, `$labels`) and a runbook naming the dashboard panel and the agent endpoint to open."""

    alert: str
    expr: str
    severity: str
    summary: str
    description: str
    runbook: str
    for_: str = "0m"
    labels: dict[str, str] = field(default_factory=dict)
    #: False only for alerts on a missing series (absent(), a target with nothing): no number exists.
    has_value: bool = True

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if self.has_value and "$value" not in self.description:
            raise ValueError(f"alert {self.alert}: the description must carry the number ($value)")
        if ":" in self.alert or not self.alert[:1].isupper():
            raise ValueError(f"alert names are CamelCase without colons, got {self.alert!r}")

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"alert": self.alert, "expr": self.expr}
        if self.for_ != "0m":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.labels}
        out["annotations"] = {"summary": self.summary, "description": self.description, "runbook": self.runbook}
        return out


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Recording | Alert, ...]
    interval: str | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name}
        if self.interval:
            out["interval"] = self.interval
        out["rules"] = [r.as_dict() for r in self.rules]
        return out
