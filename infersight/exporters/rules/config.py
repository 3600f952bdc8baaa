"""The rules' one config object: the latency objectives, the agent's scrape selector, the labels
the rules aggregate by, and each alert's threshold; validated when built (ValueError with a
message for people; the CLI prints it as one line)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

#: A PromQL label matcher list: name op "value", comma separated.
_MATCHER = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*$')
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def bucket_bounds(spec: MetricSpec) -> tuple[float, ...]:
    """The histogram's finite bucket bounds (an SLO threshold must be one of them)."""
    if spec.kind != "histogram" or not spec.buckets:
        raise ValueError(f"{spec.name} is not a histogram with buckets")
    return tuple(spec.buckets)


def _check_threshold(flag: str, value: float, spec: MetricSpec) -> None:
    """The SLI counts requests in the bucket at the threshold; a threshold between two bounds
    would have to be interpolated (a guess), so it is refused with the bounds around it."""
    bounds = bucket_bounds(spec)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{flag} must be a positive number of seconds, got {value}")
    if any(math.isclose(value, b, rel_tol=1e-9) for b in bounds):
        return
    below = [b for b in bounds if b < value]
    above = [b for b in bounds if b > value]
    near = ", ".join(f"{b:g}" for b in (below[-1:] + above[:1]))
    raise ValueError(f"{flag} {value:g} is not a bucket bound of {spec.name}, so requests under it cannot be "
                     f"counted exactly; nearest bounds: {near} (all: {' '.join(f'{b:g}' for b in bounds)})")


@dataclass(frozen=True)
class RulesConfig:
    """slo_*_s: latency objectives, each a bucket bound of its histogram; slo_target: the share of
    requests (of tokens, for ITL) that must be within them, over a 30-day budget.
    agent_selector: the label matchers that select the agent's scrape targets (`up`, `absent`).
    The default is the agent's container in deploy/kubernetes (`infersight-agent`), which both the
    PodMonitors (prometheus-operator sets `container`) and the plain scrape config (relabelled to
    `container`) label it with, whatever the job is called; beside a process on one host, pass the
    job instead (job="infersight").
    service_labels: what the SLO and dashboard rules aggregate by (replicas of one service summed);
    target_labels: what the per-agent alerts keep (one agent, one engine).
    Thresholds: preemptions_per_step is the flight recorder's storm trigger as a rate (8
    preemptions in 64 steps); kv_usage_ratio with requests waiting is KV pressure;
    moe_max_over_mean is the level /api/v1/diagnosis reports as imbalance (2.0); a task's
    speculation has collapsed when its 30-minute accept rate falls below spec_collapse_ratio of
    its 1-day rate over at least spec_min_drafts drafts; gpu_throttle_share is the share of time a
    GPU may spend clock-throttled for thermal or power reasons; gc_stall_share is the share of wall-clock
    time the engine's process may stand still in garbage collections (5%: a 0.2 s full collection every 4 s)."""

    slo_ttft_s: float = 2.5
    slo_itl_s: float = 0.1
    slo_e2e_s: float = 20.0
    slo_target: float = 0.99
    agent_selector: str = 'container="infersight-agent"'
    service_labels: tuple[str, ...] = ("namespace", "job", "model_name")
    target_labels: tuple[str, ...] = ("namespace", "job", "instance", "pod")
    preemptions_per_step: float = 8 / 64
    kv_usage_ratio: float = 0.95
    moe_max_over_mean: float = 2.0
    spec_collapse_ratio: float = 0.5
    spec_min_drafts: int = 200
    gpu_throttle_share: float = 0.1
    gc_stall_share: float = 0.05

    def __post_init__(self) -> None:
        _check_threshold("--slo-ttft-s", self.slo_ttft_s, C.TTFT)
        _check_threshold("--slo-itl-s", self.slo_itl_s, C.ITL)
        _check_threshold("--slo-e2e-s", self.slo_e2e_s, C.E2E)
        if not (0.5 <= self.slo_target < 1.0) or not math.isfinite(self.slo_target):
            raise ValueError(f"--slo-target must be in [0.5, 1) (the share of requests within the objective), "
                             f"got {self.slo_target}")
        # 1x burn over 3 days must stay measurable: a target of 0.99999 leaves 1e-5 of the traffic.
        if self.slo_target > 0.9999:
            raise ValueError(f"--slo-target above 0.9999 leaves no error budget to burn, got {self.slo_target}")
        matchers = _split_matchers(self.agent_selector)
        if not matchers or not all(_MATCHER.match(m) for m in matchers):
            raise ValueError(f"--agent-selector must be PromQL label matchers such as job=\"infersight\", "
                             f"got {self.agent_selector[:80]!r}")
        for name in ("service_labels", "target_labels"):
            labels = getattr(self, name)
            if not labels or not all(_LABEL.match(label) for label in labels):
                raise ValueError(f"{name} must be label names, got {labels!r}")
        for name, low, high in (("preemptions_per_step", 0.0, 1e6), ("kv_usage_ratio", 0.0, 1.0),
                                ("moe_max_over_mean", 1.0, 1e6), ("spec_collapse_ratio", 0.0, 1.0),
                                ("gpu_throttle_share", 0.0, 1.0), ("gc_stall_share", 0.0, 1.0)):
            value = getattr(self, name)
            if not (low < value <= high) or not math.isfinite(value):
                raise ValueError(f"{name} must be in ({low:g}, {high:g}], got {value}")
        if self.spec_min_drafts < 1:
            raise ValueError(f"spec_min_drafts must be >= 1, got {self.spec_min_drafts}")

    @property
    def error_budget(self) -> float:
        return 1.0 - self.slo_target


def _split_matchers(text: str) -> list[str]:
    """Split on commas outside quoted values."""
    parts, current, quoted, escaped = [], "", False, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append(current)
            current = ""
            continue
        current += ch
    if current.strip():
        parts.append(current)
    return parts
