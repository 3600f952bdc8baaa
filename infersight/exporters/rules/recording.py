"""Recording rules for the dashboards' heavy queries (infersight.dashboards.grafana): the latency
histograms' bucket rates and quantiles, request time by phase, slow requests by cause, prefix-cache
and speculation ratios, KV transitions, expert load, kernel time and energy per token.

Each is the dashboard's query at a fixed 5-minute window (a recording rule cannot use Grafana's
$__rate_interval), aggregated by the config's service labels instead of across everything, so one
Prometheus can hold several services. Names follow level:metric:operations: the level lists the
labels kept, the metric is the catalogue family, the operations say what was done (rate5m,
ratio_rate5m, histogram_quantile).
"""
from __future__ import annotations

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec
from infersight.exporters.rules.config import RulesConfig
from infersight.exporters.rules.expressions import base_name, by, rate_sum, ratio, record_name
from infersight.exporters.rules.rule import Group, Recording

WINDOW = "5m"
#: The quantiles the dashboards draw for each latency histogram (catalogue.spec.latency_views).
QUANTILES = (0.5, 0.9, 0.99)
LATENCY_HISTOGRAMS = (C.TTFT, C.ITL, C.E2E, C.STEP_DURATION)


def _rate(spec: MetricSpec, labels: tuple[str, ...], window: str = WINDOW) -> Recording:
    return Recording(record_name(labels, base_name(spec), f"rate{window}"), rate_sum(spec, labels, window))


def _ratio(num: MetricSpec, den: MetricSpec, labels: tuple[str, ...], window: str = WINDOW) -> Recording:
    """`<num>_per_<den without prefix>:ratio_rate<window>`, as Prometheus' naming practice writes ratios."""
    metric = f"{base_name(num)}_per_{base_name(den).removeprefix(C.P)}"
    return Recording(record_name(labels, metric, f"ratio_rate{window}"),
                     ratio(rate_sum(num, labels, window), rate_sum(den, labels, window)))


def histogram_rules(spec: MetricSpec, labels: tuple[str, ...]) -> list[Recording]:
    """The bucket rates once, then each quantile from them (the dashboards' p50/p90/p99)."""
    with_le = labels + ("le",)
    buckets = Recording(record_name(labels, spec.name + "_bucket", f"rate{WINDOW}"),
                        rate_sum(spec, with_le, WINDOW, series=spec.name + "_bucket"))
    quantiles = [Recording(record_name(labels + ("quantile",), spec.name, "histogram_quantile"),
                           f"histogram_quantile({q:g}, {buckets.record})", {"quantile": f"{q:g}"})
                 for q in QUANTILES]
    return [buckets, *quantiles]


def spec_accept_ratio(config: RulesConfig, window: str) -> Recording:
    """Accepted over proposed draft tokens by task (the Engine dashboard's acceptance panel)."""
    return _ratio(C.SPEC_ACCEPTED, C.SPEC_DRAFT, config.target_labels + ("task",), window)


def recording_groups(config: RulesConfig) -> list[Group]:
    svc = config.service_labels
    rules: list[Recording] = []
    for spec in LATENCY_HISTOGRAMS:
        rules.extend(histogram_rules(spec, svc))
    rules += [
        _rate(C.REQUESTS, svc + ("task",)),
        _rate(C.PROMPT_TOKENS, svc),
        _rate(C.GENERATION_TOKENS, svc),
        Recording(record_name(svc + ("phase",), C.PHASE.name + "_sum", f"rate{WINDOW}"),
                  rate_sum(C.PHASE, svc + ("phase",), WINDOW, series=C.PHASE.name + "_sum")),
        _rate(C.SLOW, svc + ("cause",)),
        _rate(C.PREEMPTIONS, svc + ("reason",)),
        _rate(C.KV_EVENTS, svc + ("event",)),
        _rate(C.KV_RECOMPUTED_TOKENS, svc),
        _ratio(C.PREFIX_HIT, C.PREFIX_QUERIED, svc),
        _ratio(C.PREFIX_HIT_REQUESTS, C.PREFIX_REQUESTS, svc),
        _rate(C.EXPERT_TOKENS, svc + ("layer", "expert")),
        _rate(C.KERNEL_TIME, svc + ("category",)),
        _ratio(C.ENERGY, C.GENERATION_TOKENS, svc + ("task",)),
    ]
    # What the alerts read, per agent: the probes' slots, preemptions per step, speculation by task.
    target = config.target_labels
    rules += [
        _rate(C.PROBE_EVENTS, target + ("ring",)),
        _rate(C.PROBE_DROPPED, target + ("ring",)),
        _ratio(C.PREEMPTIONS, C.STEPS, target),
        spec_accept_ratio(config, "30m"),
        spec_accept_ratio(config, "1d"),
        _ratio(C.RECORDER_COST, C.RECORDER_ENGINE, target, "1h"),
    ]
    return [Group("infersight.recording", tuple(rules))]
