"""SpeculationCanary: one task's speculation change, from the advice to kept or rolled back.

    proposed   the advice (correlate.spec_advice) says disable (or re-enable) for a task, with an
               interval that excludes 1; "inconclusive" advice proposes nothing
    canaried   the policy goes to the engine: the task's requests take the new setting, except a random
               control_share of them, which keep the old one (each request's arm is in its probe records)
    kept       after min_window_s, with min_requests finished in each arm: the treatment arm's median
               per-output-token latency is lower than the control arm's, the whole 95% interval below 0;
               the whole task then takes the new setting
    rolled_back  the interval is above 0 (the change hurts), or max_window_s passed without a
               confirmation (too few requests, or an interval that still holds 0): the old setting back

Only requests that arrived under the canary's policy generation count (their POLICY_ARM seq).

The re-check. Once a task's speculation is off, none of its speculative steps is seen any more, so the
advice (which predicts from them) can never ask to turn it back on, though the draft or the load may
have changed since. So, as an SRE would re-test a disabled feature, recheck_s after the disable was
kept (or after the task's last re-check found no gain) the task gets a canary the other way: proposed
(trigger "recheck"), canaried with speculate=True for the treatment arm and the control arm kept off,
then kept (re-enabled) only on the same A/B, the whole interval below 0; otherwise rolled back, and
the next re-check waits the full interval again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.autoapply.decisions import DecisionLog
from infersight.agent.autoapply.policy_writer import PolicyWriter
from infersight.agent.autoapply.verdict import BETTER, WORSE, arm_verdict
from infersight.probes.policy_block import TaskPolicy

#: PolicyArm values in the probe records (runtime's run policy).
TREATMENT, CONTROL = 1, 2
#: What each advice asks of the task's speculation.
_WANTS = {"disable_speculation": False, "keep_speculation": True}


@dataclass
class CanaryState:
    change_id: int
    task: str
    before: bool
    after: bool
    started_ns: int
    seq: int


def proposal(advice: list[dict[str, Any]], in_force: dict[str, bool],
             refused: dict[tuple[str, bool], int], now_ns: int) -> dict[str, Any] | None:
    """The first advice that asks for a change of what is in force (a task absent from in_force
    speculates), skipping inconclusive advice and changes rolled back until refused[(task, after)]."""
    for a in advice:
        wanted = _WANTS.get(str(a.get("action")))
        task = str(a.get("task"))
        if wanted is None or in_force.get(task, True) == wanted:
            continue
        if refused.get((task, wanted), 0) > now_ns:
            continue
        return a
    return None


class SpeculationCanary:
    def __init__(self, config: AutoApplyConfig, log: DecisionLog, writer: PolicyWriter,
                 rng: np.random.Generator) -> None:
        self.config, self.log, self.writer, self.rng = config, log, writer, rng
        self.in_force: dict[str, bool] = {}  # task -> speculate, for tasks the loop changed
        self.refused: dict[tuple[str, bool], int] = {}  # a rolled-back change: not proposed again before
        self.current: CanaryState | None = None
        self.off_since: dict[str, int] = {}  # task -> when its speculation went off for good (or a re-check failed)
        self.changed_at: dict[str, int] = {}  # task -> when a change of it was kept: the advice counts later steps only

    def start(self, advice: dict[str, Any], change_id: int, now_ns: int) -> None:
        task = str(advice["task"])
        numbers = {k: advice.get(k) for k in ("speedup", "speedup_low", "speedup_high", "basis")}
        self._begin(task, _WANTS[str(advice["action"])], change_id, now_ns, str(advice.get("reason", "")),
                    {"trigger": "advice", **numbers})

    def recheck_due(self, now_ns: int) -> str | None:
        """The first task whose speculation the loop turned off recheck_s or more ago (None: none)."""
        for task, since in self.off_since.items():
            if self.in_force.get(task, True) is False and now_ns - since >= self.config.recheck_s * 1e9:
                return task
        return None

    def start_recheck(self, task: str, change_id: int, now_ns: int) -> None:
        off_s = (now_ns - self.off_since[task]) / 1e9
        self._begin(task, True, change_id, now_ns,
                    f"{task}: re-check: speculation has been off for {off_s:.0f} s (--auto-apply-recheck-s "
                    f"{self.config.recheck_s:g}); none of its speculative steps are seen while it is off, so the "
                    f"advice cannot say whether it would help now: a canary with speculation on measures it",
                    {"trigger": "recheck", "recheck_s": self.config.recheck_s, "off_for_s": round(off_s, 3),
                     "basis": "periodic re-check (no prediction: the task runs no speculative step while off)"})

    def _begin(self, task: str, after: bool, change_id: int, now_ns: int, reason: str,
               numbers: dict[str, Any]) -> None:
        before = self.in_force.get(task, True)
        self.log.record(change_id, "proposed", "speculation", task, before, after, reason, numbers)
        self.writer.tasks[task] = TaskPolicy(task, after, before, self.config.control_share)
        seq = self.writer.publish()
        self.current = CanaryState(change_id, task, before, after, now_ns, seq)
        self.log.record(change_id, "canaried", "speculation", task, before, after,
                        f"{task}: speculate={after} for {1 - self.config.control_share:.0%} of its requests; "
                        f"{self.config.control_share:.0%} keep speculate={before} (the control arm)",
                        {"control_share": self.config.control_share, "min_window_s": self.config.min_window_s,
                         "max_window_s": self.config.max_window_s, "min_requests": self.config.min_requests},
                        policy_seq=seq)
        self._publish_state()

    def evaluate(self, samples: pd.DataFrame, now_ns: int) -> str | None:
        """Judge the canary in flight: "kept", "rolled_back" or None (still measuring)."""
        c = self.current
        if c is None:
            return None
        elapsed = (now_ns - c.started_ns) / 1e9
        if elapsed < self.config.min_window_s:
            return None
        mine = samples[(samples["seq"] == c.seq) & (samples["task"] == c.task)] if len(samples) else samples
        control = mine.loc[mine["arm"] == CONTROL, "tpot_s"].to_numpy(np.float64) if len(mine) else np.empty(0)
        treatment = mine.loc[mine["arm"] == TREATMENT, "tpot_s"].to_numpy(np.float64) if len(mine) else np.empty(0)
        enough = min(np.isfinite(control).sum(), np.isfinite(treatment).sum()) >= self.config.min_requests
        out_of_time = elapsed >= self.config.max_window_s
        if not enough and not out_of_time:
            return None
        verdict = arm_verdict(control, treatment, self.rng, self.config.interval_resamples)
        verdict["window_s"] = round(elapsed, 3)
        span = self._span(verdict)
        if enough and verdict["verdict"] == BETTER:
            self._settle("kept", c.after, now_ns, f"{c.task}: speculate={c.after} measured better: {span}", verdict)
            return "kept"
        if enough and verdict["verdict"] == WORSE:
            why = f"{c.task}: speculate={c.after} measured worse: {span}"
        elif not out_of_time:
            return None  # inconclusive: nothing changes until the interval decides or the window ends
        elif not enough:
            why = (f"{c.task}: not confirmed within {self.config.max_window_s:g} s: {verdict['control_n']} control and "
                   f"{verdict['treatment_n']} treatment requests, {self.config.min_requests} each needed")
        else:
            why = f"{c.task}: not confirmed within {self.config.max_window_s:g} s: {span}"
        self._settle("rolled_back", c.before, now_ns, why, verdict)
        self.refused[(c.task, c.after)] = now_ns + int(10 * max(self.config.cooldown_s, self.config.min_window_s) * 1e9)
        return "rolled_back"

    @staticmethod
    def _span(v: dict[str, Any]) -> str:
        if "difference_s" not in v:
            return f"{v['control_n']} control vs {v['treatment_n']} treatment requests, no difference computable"
        low, high = v["interval_95_s"]
        return (f"median per-output-token latency {v['treatment_median_s'] * 1e3:.2f} ms (treatment, n="
                f"{v['treatment_n']}) vs {v['control_median_s'] * 1e3:.2f} ms (control, n={v['control_n']}), "
                f"difference {v['difference_s'] * 1e3:+.2f} ms, 95% interval [{low * 1e3:+.2f}, {high * 1e3:+.2f}] ms "
                f"(measured)")

    def _settle(self, stage: str, setting: bool, now_ns: int, reason: str, verdict: dict[str, Any]) -> None:
        c = self.current
        assert c is not None
        if stage == "kept":
            self.changed_at[c.task] = now_ns
        if setting is False:  # off from now on: the re-check clock (re)starts
            self.off_since[c.task] = now_ns
        else:
            self.off_since.pop(c.task, None)
        if stage == "kept" or setting is not True:
            self.writer.tasks[c.task] = TaskPolicy(c.task, setting, setting, 0.0)
            self.in_force[c.task] = setting
        else:  # back to the engine's default: no entry
            self.writer.tasks.pop(c.task, None)
            self.in_force.pop(c.task, None)
        seq = self.writer.publish()
        self.log.record(c.change_id, stage, "speculation", c.task, c.before, c.after, reason, verdict, policy_seq=seq)
        self.current = None
        self._publish_state()

    def _publish_state(self) -> None:
        shown = dict(self.in_force)
        if self.current is not None:
            shown[self.current.task] = self.current.after
        self.log.set_in_force(speculation=shown, in_flight={"speculation": int(self.current is not None)})
