"""The flight recorder's overhead budget: what a window really cost the engine, and when the next
one may start so that the measured, amortised cost stays under the budget.

What a window costs (`window_cost`), from the STEP records (step_id, start_ns, end_ns):

    steps   ... b b b b | w w w w | a a | n ...      b: baseline, w: window, a: after, n: next
    cost = start(n) - start(first w) - (window + after steps) x median period(b)

A step's period is start-to-start, so the profiler's start (inside the first window step), its
slower steps, the trace export (after the last window step's end, before the next step) and any
slowdown right after (the `after` steps) are all in it. The baseline is the steps just before the
window that ran requests and were not themselves affected by an earlier window. The noise floor
is the baseline periods' median absolute deviation x sqrt(steps charged): a cost below it is not
told apart from jitter. A cost measured below zero is charged as zero (FlightRecorder): the
signed figure is kept beside it. An engine that goes idle right after a window gets that idle time
charged too: an over-estimate, so the rate drops, never the other way.

When the next window may start (`WindowBudget`): a token bucket in engine time. Every second of
engine step time earns `budget` seconds of allowance (capped at `burst` windows' worth); a window
is asked for only when the allowance covers its reservation, which is held at once and settled
with the measured cost when it is known. The reservation is the dearer of the smoothed estimate and
the dearest of the last `recent_windows` measured windows (before any, `initial_cost_s`, or the
costs an earlier run measured on this engine: `seed`): with the estimate alone, every window dearer
than the running average overspent, and the cost ran above the budget about half the time. Allowance
never exceeds budget x engine time - cost, so the cost stays under the budget at every window whose
measured cost is within its reservation; a window dearer than all recent ones overspends by the
difference, which the windows after it wait out.

So the first window keeps the budget only if the guess before it is not below its real cost: the
guess is the dearest window we have measured (INITIAL_COST_S), and a run that knows better says so
(--recorder-initial-cost, or the costs kept in --recorder-dir by the run before).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from infersight.agent.recorder.config import INITIAL_COST_S


@dataclass(frozen=True)
class WindowCost:
    """cost_s: measured extra engine time (may be slightly negative: jitter); noise_s: its noise
    floor; base_period_s: the baseline's median step period; charged_steps: window + after."""

    cost_s: float
    noise_s: float
    base_period_s: float
    charged_steps: int
    baseline_steps: int


def window_cost(steps: pd.DataFrame, first_step: int, window_steps: int, after_steps: int = 2,
                baseline_steps: int = 32, not_before: int = -1) -> WindowCost | None:
    """The cost of the window [first_step, first_step + window_steps) (module docstring). steps:
    step_id, start_ns, end_ns, batch_size (any order; other columns ignored). not_before: baseline
    steps must have ids > this (the last step an earlier window affected). None until the step
    after the charged ones has arrived, or with fewer than 3 baseline steps."""
    by_id = steps.drop_duplicates("step_id").set_index("step_id").sort_index()
    end_id = first_step + window_steps + after_steps
    if first_step not in by_id.index or end_id not in by_id.index:
        return None
    ids = by_id.index.to_numpy(np.int64)
    starts = by_id["start_ns"].to_numpy(np.int64)
    # Periods of consecutive steps before the window (start to the next one's start).
    nxt = np.searchsorted(ids, ids + 1)
    consecutive = (nxt < len(ids)) & (ids[np.minimum(nxt, len(ids) - 1)] == ids + 1)
    busy = by_id["batch_size"].to_numpy(np.int64) > 0
    usable = consecutive & busy & (ids > not_before) & (ids + 1 < first_step)
    periods = (starts[np.minimum(nxt, len(ids) - 1)] - starts)[usable][-baseline_steps:]
    if len(periods) < 3:
        return None
    base = float(np.median(periods))
    mad = float(np.median(np.abs(periods - base)))
    charged = window_steps + after_steps
    span = int(by_id.at[end_id, "start_ns"]) - int(by_id.at[first_step, "start_ns"])
    return WindowCost(cost_s=(span - charged * base) / 1e9, noise_s=1.4826 * mad * math.sqrt(charged) / 1e9,
                      base_period_s=base / 1e9, charged_steps=charged, baseline_steps=len(periods))


@dataclass
class WindowBudget:
    """The token bucket of the module docstring. budget: allowed share of engine time (0.005 is
    0.5%); initial_cost_s: the cost assumed before any is measured; burst: allowance cap, in
    windows at the current reservation; smoothing: weight of a new measurement in the estimate;
    recent_windows: how many measured windows the reservation covers (0: the estimate alone)."""

    budget: float = 0.005
    initial_cost_s: float = INITIAL_COST_S
    burst: float = 2.0
    smoothing: float = 0.3
    recent_windows: int = 8
    allowance_s: float = 0.0
    estimate_s: float = -1.0
    engine_s: float = 0.0      # engine step time seen so far
    cost_s: float = 0.0        # measured cost of the sampled windows so far (what the budget bounds)
    triggered_cost_s: float = 0.0  # measured cost of triggered captures (bounded by their cool-down)
    measured: int = 0          # windows whose cost updated the estimate
    seeded: int = 0            # costs an earlier run measured that the reservation started from
    _reserved_s: float = 0.0
    _recent: deque[float] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.budget < 1.0:
            raise ValueError(f"the recorder budget must be in (0, 1), got {self.budget}")
        if not self.initial_cost_s > 0:
            raise ValueError(f"the initial cost estimate must be > 0 s, got {self.initial_cost_s}")
        if self.estimate_s < 0:
            self.estimate_s = self.initial_cost_s
        if self.recent_windows < 0:
            raise ValueError(f"recent_windows must be >= 0, got {self.recent_windows}")
        self._recent = deque(maxlen=self.recent_windows)  # maxlen 0: keeps none, the estimate alone

    @property
    def reserve_s(self) -> float:
        """What the next window holds: the dearer of the estimate and the dearest recent window."""
        return max(self.estimate_s, max(self._recent, default=0.0))

    def seed(self, costs: list[float]) -> None:
        """Start from window costs an earlier run measured on this engine (oldest first) instead of the
        guess: the reservation is the dearest of them, as if this run had measured them itself. Only
        before this run measured any: its own windows know better."""
        if self.measured or not costs:
            return
        recent = [max(c, 0.0) for c in costs[-max(self.recent_windows, 1):]]
        self._recent.extend(recent)  # maxlen 0 (the estimate alone) keeps none
        self.estimate_s = max(self.initial_cost_s * 1e-6, max(recent))
        self.seeded = len(recent)

    def earn(self, engine_seconds: float) -> None:
        """Engine step time observed: it earns budget x that much allowance."""
        self.engine_s += engine_seconds
        cap = self.burst * self.reserve_s
        self.allowance_s = min(cap, self.allowance_s + self.budget * engine_seconds)

    def can_start(self) -> bool:
        """Whether the allowance covers one more window's reservation (none reserved)."""
        return self._reserved_s == 0.0 and self.allowance_s >= self.reserve_s

    def reserve(self) -> None:
        """A window was asked for: hold its reservation."""
        self._reserved_s = self.reserve_s
        self.allowance_s -= self._reserved_s

    def release(self) -> None:
        """The reserved window never ran (refused, failed before its steps): give the reservation back."""
        self.allowance_s += self._reserved_s
        self._reserved_s = 0.0

    def settle(self, measured_s: float, update_estimate: bool = True) -> None:
        """The reserved window's measured cost is known: the allowance pays the difference and the
        estimate moves toward it (never below a millionth of the initial guess: cost is never free)."""
        self.allowance_s += self._reserved_s - measured_s
        self._reserved_s = 0.0
        self.cost_s += measured_s
        if update_estimate:
            # The first measurement replaces the guess; later ones move the estimate by `smoothing`.
            prior = self.estimate_s if self.measured else max(measured_s, 0.0)
            self.estimate_s = max(self.initial_cost_s * 1e-6,
                                  (1 - self.smoothing) * prior + self.smoothing * max(measured_s, 0.0))
            self._recent.append(max(measured_s, 0.0))
            self.measured += 1

    def charge(self, measured_s: float) -> None:
        """A triggered capture's measured cost: kept apart, not paid from the windows' allowance. An
        incident's capture is bounded by the trigger cool-down instead; charging it to the sampling
        budget would silence the always-on view for the very minutes after an incident."""
        self.triggered_cost_s += measured_s

    @property
    def cost_ratio(self) -> float:
        """Measured cost so far over engine time so far (0 before any engine time)."""
        return self.cost_s / self.engine_s if self.engine_s > 0 else 0.0

    @property
    def interval_s(self) -> float:
        """Engine seconds between windows at the current reservation."""
        return self.reserve_s / self.budget
