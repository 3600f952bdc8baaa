"""When the flight recorder takes a full capture instead of a sampled window: a latency objective
breached, or an anomaly in the steps. Pure rules over frames, plus a gate that bounds how often.

- slo_<metric> (`slo_breach`): over the last `window` finished requests (at least `min_requests`),
  the `quantile` of TTFT, mean ITL or e2e is above the SLO the agent was given (--slo-ttft-s,
  --slo-itl-s, --slo-e2e-s: the slow rule's SLOs, correlate.slow_rule). The worst ratio wins.
- preemption_storm (`preemption_storm`): at least `min_preemptions` requests preempted in the
  last `over_steps` steps.
- step_time_jump (`step_time_jump`): the median duration of the last `recent` decode-only steps
  is `factor` x that of the `baseline` decode-only steps before them, while their median batch
  has not grown by more than `max_batch_growth` (a bigger batch is a reason, not an anomaly).
  Steps a window or capture affected are left out: profiling them slows them on purpose.

Reasons are catalogue.RECORDER_REASONS.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from infersight.correlate.slow_rule import SLO_COLUMNS


@dataclass(frozen=True)
class Trigger:
    """reason: a RECORDER_REASONS value; detail: the numbers behind it, in words."""

    reason: str
    detail: str


def slo_breach(finished: pd.DataFrame, slos: dict[str, float], quantile: float, window: int,
               min_requests: int) -> Trigger | None:
    """The SLO rule of the module docstring. finished: request rows (ttft_s, itl_mean_s, e2e_s) in
    finish order; slos: metric (ttft | itl | e2e) -> seconds."""
    recent = finished.iloc[-window:]
    if len(recent) < min_requests or not slos:
        return None
    worst: tuple[float, str, float, float] | None = None
    for metric, slo in slos.items():
        values = recent[SLO_COLUMNS[metric]].to_numpy(np.float64)
        values = values[~np.isnan(values)]
        if len(values) < min_requests:
            continue
        q = float(np.quantile(values, quantile))
        if q > slo and (worst is None or q / slo > worst[0]):
            worst = (q / slo, metric, q, slo)
    if worst is None:
        return None
    _, metric, q, slo = worst
    return Trigger(f"slo_{metric}", f"{metric} p{round(quantile * 100, 6):g} {q:.4g} s > SLO {slo:g} s "
                                    f"over the last {len(recent)} requests")


def preemption_storm(steps: pd.DataFrame, min_preemptions: int, over_steps: int) -> Trigger | None:
    """steps: step_id, preempted (any order)."""
    recent = steps.sort_values("step_id").iloc[-over_steps:]
    n = int(recent["preempted"].sum()) if not recent.empty else 0
    if n < min_preemptions:
        return None
    return Trigger("preemption_storm", f"{n} preemptions in the last {len(recent)} steps (>= {min_preemptions})")


def step_time_jump(steps: pd.DataFrame, affected: np.ndarray, factor: float, recent: int = 16,
                   baseline: int = 256, max_batch_growth: float = 1.25) -> Trigger | None:
    """steps: step_id, start_ns, end_ns, prefill_tokens, batch_size; affected: step ids a window
    or capture affected (left out)."""
    d = steps[(steps["prefill_tokens"] == 0) & (steps["batch_size"] > 0) & ~steps["step_id"].isin(affected)]
    d = d.sort_values("step_id")
    if len(d) < recent + max(recent, 16):
        return None
    now, before = d.iloc[-recent:], d.iloc[-(recent + baseline):-recent]
    dur_now = float(np.median(now["end_ns"] - now["start_ns"]))
    dur_before = float(np.median(before["end_ns"] - before["start_ns"]))
    batch_now, batch_before = float(np.median(now["batch_size"])), float(np.median(before["batch_size"]))
    if dur_before <= 0 or dur_now < factor * dur_before or batch_now > max_batch_growth * batch_before:
        return None
    return Trigger("step_time_jump", f"decode step median {dur_now / 1e6:.3f} ms over the last {len(now)} steps, "
                                     f"{dur_now / dur_before:.1f}x the {dur_before / 1e6:.3f} ms of the "
                                     f"{len(before)} before (batch {batch_before:g} -> {batch_now:g})")


@dataclass
class TriggerGate:
    """At most one triggered capture per `cooldown_s` (monotonic seconds), whatever the reason."""

    cooldown_s: float = 300.0
    last_s: float = -1e18

    def open(self, now_s: float) -> bool:
        return now_s - self.last_s >= self.cooldown_s

    def fired(self, now_s: float) -> None:
        self.last_s = now_s
