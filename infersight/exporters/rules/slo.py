"""Latency SLOs: the SLI of each (TTFT, ITL, e2e) from its histogram's bucket at the objective, its
error ratio recorded over the burn-rate windows, and multi-window, multi-burn-rate alerts (the
Google SRE workbook's scheme, as the kube-prometheus mixins use it).

    SLI           = rate(<hist>_bucket{le=<objective>}[w]) / rate(<hist>_count[w])
    error ratio   = 1 - SLI                       (requests, or tokens for ITL, over the objective)
    burn rate     = error ratio / (1 - target)    (1x spends a 30-day budget in 30 days)

A pair fires when both its long and its short window burn faster than its factor: the long window
says enough budget went, the short one that it is still going (so the alert stops soon after the
burn does). With no traffic in a window the ratio is 0/0 = NaN, which compares false: no alert.
"""
from __future__ import annotations

from dataclasses import dataclass

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec
from infersight.exporters.rules import runbook as R
from infersight.exporters.rules.config import RulesConfig
from infersight.exporters.rules.expressions import base_name, by, le_matcher, record_name
from infersight.exporters.rules.rule import Alert, Group, Recording

#: The budget's period the factors are sized for.
BUDGET_DAYS = 30


@dataclass(frozen=True)
class BurnWindow:
    """Alert when both windows burn above `factor`: `budget_share` of a 30-day budget is gone
    within `long` at that factor."""

    long: str
    short: str
    factor: float
    severity: str
    for_: str
    hours: float

    @property
    def budget_share(self) -> float:
        return self.factor * self.hours / (BUDGET_DAYS * 24)


#: The SRE workbook's four pairs: two that page (2% of the budget in 1 h, 5% in 6 h), two tickets
#: (10% in 1 day, 10% in 3 days).
BURN_WINDOWS = (
    BurnWindow("1h", "5m", 14.4, "critical", "2m", 1),
    BurnWindow("6h", "30m", 6.0, "critical", "15m", 6),
    BurnWindow("1d", "2h", 3.0, "warning", "1h", 24),
    BurnWindow("3d", "6h", 1.0, "warning", "3h", 72),
)
WINDOWS = tuple(sorted({w for b in BURN_WINDOWS for w in (b.long, b.short)},
                       key=lambda w: int(w[:-1]) * {"m": 1, "h": 60, "d": 1440}[w[-1]]))


@dataclass(frozen=True)
class Objective:
    key: str          # ttft | itl | e2e: the alert's slo label
    title: str        # the alert name's middle
    spec: MetricSpec
    threshold_s: float
    unit: str         # what the SLI counts: requests, or tokens for ITL
    panel: R.Panel


def objectives(config: RulesConfig) -> tuple[Objective, ...]:
    return (
        Objective("ttft", "TimeToFirstToken", C.TTFT, config.slo_ttft_s, "requests", R.TTFT_PANEL),
        Objective("itl", "InterTokenLatency", C.ITL, config.slo_itl_s, "tokens", R.ITL_PANEL),
        Objective("e2e", "EndToEndLatency", C.E2E, config.slo_e2e_s, "requests", R.E2E_PANEL),
    )


def error_ratio_name(objective: Objective, config: RulesConfig, window: str) -> str:
    return record_name(config.service_labels, base_name(objective.spec), f"slo_error_ratio_rate{window}")


def error_ratio_rules(objective: Objective, config: RulesConfig) -> list[Recording]:
    labels = config.service_labels
    rules = []
    for window in WINDOWS:
        within = f"sum {by(labels)} (rate({objective.spec.name}_bucket{{{le_matcher(objective.threshold_s)}}}[{window}]))"
        total = f"sum {by(labels)} (rate({objective.spec.name}_count[{window}]))"
        rules.append(Recording(error_ratio_name(objective, config, window), f"1 - (\n  {within}\n/\n  {total}\n)"))
    return rules


def burn_alerts(objective: Objective, config: RulesConfig) -> list[Alert]:
    budget = f"{config.error_budget:.6g}"
    target = f"{100 * config.slo_target:.6g}%"
    what = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "end-to-end latency"}[objective.key]
    alerts = []
    for w in BURN_WINDOWS:
        long_name, short_name = (error_ratio_name(objective, config, x) for x in (w.long, w.short))
        expr = (f"(\n  {long_name} / {budget} > {w.factor:g}\n)\nand\n"
                f"(\n  {short_name} / {budget} > {w.factor:g}\n)")
        alerts.append(Alert(
            alert=f"Infersight{objective.title}BudgetBurn",
            expr=expr, severity=w.severity, for_=w.for_,
            labels={"slo": objective.key, "long_window": w.long, "short_window": w.short},
            summary=f"{{{{ $labels.job }}}}: {what} SLO error budget burning {w.factor:g}x too fast over {w.long}",
            description=(
                f"Over the last {w.long}, {{{{ $labels.job }}}} (namespace {{{{ $labels.namespace }}}}) burned its "
                f"{what} error budget {{{{ $value | printf \"%.4g\" }}}}x as fast as the objective allows "
                f"(alert above {w.factor:g}x over {w.long} and {w.short}). Objective: {target} of {objective.unit} "
                f"within {objective.threshold_s:g} s over {BUDGET_DAYS} days; at this pace "
                f"{100 * w.budget_share:.3g}% of the budget goes every {w.long}."),
            runbook=R.runbook(
                (objective.panel, R.PHASE_PANEL, R.SLOW_PANEL),
                f"on each agent of the job read {R.SLOWEST} (the slowest requests, each split into queue, prefill, "
                f"preemption stall, decode and network, with its cause) and {R.DIAGNOSIS}",
                "The phase that grew and the dominant slow cause say whether to add capacity (queue), "
                "shorten prompts or enable chunked prefill (prefill), or give the KV cache room (preemption).")))
    return alerts


def slo_groups(config: RulesConfig) -> list[Group]:
    """One recording group (the error ratios) and one alert group per objective."""
    recordings: list[Recording] = []
    alerts: list[Alert] = []
    for objective in objectives(config):
        recordings.extend(error_ratio_rules(objective, config))
        alerts.extend(burn_alerts(objective, config))
    return [Group("infersight-slo.recording", tuple(recordings)), Group("infersight-slo.alerts", tuple(alerts))]
