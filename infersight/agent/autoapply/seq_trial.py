"""SeqTrial: the scheduler's max_num_seqs tuned against a stated SLO by alternating windows.

max_num_seqs is global (every request shares the batch), so its two settings cannot run side by
side as a task's arms do; they take turns instead:

    window   0          1          2          3        ...   seq_windows - 1
    limit    candidate  current    candidate  current  ...   current

Each window's requests are those that arrived under its policy generation (POLICY_ARM seq) and
finished before it ended: a request that straddles a switch counts for neither. Alternating spreads a
drift of the load over both settings. After the last window, the share of requests that met the SLO
(TTFT and mean ITL within their objectives) under the candidate is compared with the current's
(agent.autoapply.verdict.slo_verdict): kept only when the whole interval of the difference is above
0; otherwise the current limit is back.

proposed only when the SLO is missed at all: of the requests finished in the last seq_window_s (at
least the last min_requests, and every request that finished with the oldest of those), fewer than all
met it (nothing to gain otherwise). By time, not by a count alone: requests admitted together finish in
the same step, and the last min_requests of a cohort can be exactly those that found a slot free, the
ones that waited for it finishing first (a CI run of the closed-loop test saw no proposal in 60 s so).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.autoapply.decisions import DecisionLog
from infersight.agent.autoapply.policy_writer import PolicyWriter
from infersight.agent.autoapply.verdict import BETTER, slo_met, slo_verdict


@dataclass
class Window:
    limit: int
    seq: int
    start_ns: int
    end_ns: int = 0


@dataclass
class TrialState:
    change_id: int
    current: int
    candidate: int
    windows: list[Window] = field(default_factory=list)


class SeqTrial:
    def __init__(self, config: AutoApplyConfig, log: DecisionLog, writer: PolicyWriter,
                 rng: np.random.Generator) -> None:
        self.config, self.log, self.writer, self.rng = config, log, writer, rng
        self.current: TrialState | None = None
        self.tried: set[int] = set()  # candidates already judged (kept or not): tried once each

    def _met(self, rows: pd.DataFrame) -> np.ndarray:
        assert self.config.slo_ttft_s is not None and self.config.slo_itl_s is not None
        return slo_met(rows["ttft_s"].to_numpy(np.float64), rows["tpot_s"].to_numpy(np.float64),
                       self.config.slo_ttft_s, self.config.slo_itl_s)

    def candidate(self, samples: pd.DataFrame) -> tuple[int, int, float] | None:
        """(current limit, candidate, recent SLO share met) when a trial is worth running, else None."""
        configured = self.writer.configured_max_num_seqs()
        current = self.writer.max_num_seqs or configured
        if current < 1:
            return None
        options = [c for c in (self.config.seq_candidates or (max(1, current // 2),))
                   if c != current and c <= configured and c not in self.tried]
        if not options or len(samples) < self.config.min_requests:
            return None
        share = float(self._met(self._recent(samples)).mean())
        return (current, options[0], share) if share < 1.0 else None

    def _recent(self, samples: pd.DataFrame) -> pd.DataFrame:
        """The requests finished in the last seq_window_s before the newest finish, or since the oldest of
        the last min_requests if that reaches further back; ties at the edge included (module docstring)."""
        finished = samples["finished_ns"].to_numpy(np.int64)
        edge = min(int(finished.max()) - int(self.config.seq_window_s * 1e9),
                   int(np.sort(finished)[-self.config.min_requests]))
        return samples[finished >= edge]

    def start(self, current: int, candidate: int, share: float, change_id: int, now_ns: int) -> None:
        slo = {"slo_ttft_s": self.config.slo_ttft_s, "slo_itl_s": self.config.slo_itl_s}
        self.log.record(change_id, "proposed", "max_num_seqs", "engine", current, candidate,
                        f"the SLO (TTFT <= {self.config.slo_ttft_s} s, mean ITL <= {self.config.slo_itl_s} s) was met "
                        f"by {share:.0%} of the last {self.config.min_requests} requests (measured) at max_num_seqs="
                        f"{current}: trying {candidate}", {**slo, "recent_share_met": share})
        self.current = TrialState(change_id, current, candidate)
        self._open_window(now_ns)
        self.log.record(change_id, "canaried", "max_num_seqs", "engine", current, candidate,
                        f"{self.config.seq_windows} alternating windows of {self.config.seq_window_s:g} s, "
                        f"{candidate} first", {**slo, "windows": self.config.seq_windows,
                                               "window_s": self.config.seq_window_s},
                        policy_seq=self.current.windows[0].seq)
        self.log.set_in_force(in_flight={"max_num_seqs": 1})

    def _open_window(self, now_ns: int) -> None:
        t = self.current
        assert t is not None
        limit = t.candidate if len(t.windows) % 2 == 0 else t.current
        self.writer.max_num_seqs = limit
        t.windows.append(Window(limit, self.writer.publish(), now_ns))
        self.log.set_in_force(max_num_seqs=limit)

    def evaluate(self, samples: pd.DataFrame, now_ns: int) -> str | None:
        """Advance the windows; after the last, "kept" or "rolled_back"; None while measuring."""
        t = self.current
        if t is None:
            return None
        last = t.windows[-1]
        if now_ns - last.start_ns < self.config.seq_window_s * 1e9:
            return None
        last.end_ns = now_ns
        if len(t.windows) < self.config.seq_windows:
            self._open_window(now_ns)
            return None
        groups: dict[int, list[np.ndarray]] = {t.current: [], t.candidate: []}
        for w in t.windows:
            rows = samples[(samples["seq"] == w.seq) & (samples["finished_ns"] <= w.end_ns)] if len(samples) else samples
            groups[w.limit].append(self._met(rows) if len(rows) else np.empty(0, bool))
        cur, cand = (np.concatenate(groups[k]) for k in (t.current, t.candidate))
        verdict = slo_verdict(cur, cand, self.rng, self.config.interval_resamples)
        verdict["windows"] = [{"max_num_seqs": w.limit, "policy_seq": w.seq, "seconds": (w.end_ns - w.start_ns) / 1e9}
                              for w in t.windows]
        enough = min(len(cur), len(cand)) >= self.config.min_requests
        stage = "kept" if enough and verdict["verdict"] == BETTER else "rolled_back"
        self.writer.max_num_seqs = t.candidate if stage == "kept" else t.current
        seq = self.writer.publish()
        if "difference" in verdict:
            low, high = verdict["interval_95"]
            numbers = (f"SLO met by {verdict['candidate_met']:.1%} at {t.candidate} (n={len(cand)}) vs "
                       f"{verdict['current_met']:.1%} at {t.current} (n={len(cur)}), difference "
                       f"{verdict['difference']:+.1%}, 95% interval [{low:+.1%}, {high:+.1%}] (measured)")
        else:
            numbers = f"{len(cand)} requests at {t.candidate}, {len(cur)} at {t.current}: nothing to compare"
        why = ("met the SLO more often" if stage == "kept" else "not confirmed better" if enough
               else f"not judged: too few requests ({self.config.min_requests} a setting needed)")
        self.log.record(t.change_id, stage, "max_num_seqs", "engine", t.current, t.candidate,
                        f"max_num_seqs={t.candidate} {why}: {numbers}", verdict, policy_seq=seq)
        self.tried.add(t.candidate)
        self.current = None
        self.log.set_in_force(max_num_seqs=self.writer.max_num_seqs, in_flight={"max_num_seqs": 0})
        return stage
