"""SlowJudge: which finished requests are slow, and why.

slow_rule flags a request against the window of recent finished requests (across polls: its
e2e above their quantile, or over an SLO); slow_causes attributes the flagged ones to a cause
from the steps they ran in, their verifications and their KV reloads.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.agent.slow.config import SlowRequestConfig
from infersight.correlate import slow_causes, slow_rule


class SlowJudge:
    def __init__(self, config: SlowRequestConfig) -> None:
        self.rule = slow_rule.SlowRule(config.quantile, config.window, config.min_requests_for_p99,
                                       config.slo_ttft_s, config.slo_itl_s, config.slo_e2e_s)
        self.window = pd.DataFrame()  # slow_features of the last slow_window finished requests

    def judge(self, rows: pd.DataFrame, done: pd.DataFrame, steps: pd.DataFrame, batch: pd.DataFrame,
              spec: pd.DataFrame, reloads: pd.DataFrame, host_pauses: pd.DataFrame | None = None) -> pd.DataFrame:
        """attribute_slow's verdicts on the requests of `rows` (request_table rows; `done`: their
        events) that the rule flags; spec: their verifications; steps, batch: the attribution window;
        host_pauses: the engine's garbage-collection pauses since the oldest of them arrived."""
        features = slow_causes.slow_features(rows, done, steps, batch, spec, reloads, host_pauses)
        verdicts, self.window = slow_rule.judge_slow(features.sort_values("finish_ns", kind="stable"),
                                                     self.window, self.rule)
        return slow_causes.attribute_slow(_flagged(features, verdicts), self.window)


def _flagged(features: pd.DataFrame, verdicts: pd.DataFrame) -> pd.DataFrame:
    """features.merge(the slow verdicts' request_id, metric, threshold_s, on="request_id"): the
    flagged requests' rows in features' order, by lookup (a merge costs ms; few are flagged)."""
    slow = verdicts[verdicts["slow"].to_numpy(bool)]
    verdict_of = dict(zip(slow["request_id"].tolist(), zip(slow["metric"].tolist(), slow["threshold_s"].tolist())))
    ids = features["request_id"].to_numpy(np.int64)
    keep = np.flatnonzero(np.isin(ids, np.fromiter(verdict_of, np.int64, len(verdict_of))))
    out = features.iloc[keep].reset_index(drop=True)
    picked = [verdict_of[r] for r in ids[keep].tolist()]
    out["metric"] = pd.Series([m for m, _ in picked], dtype=object)
    out["threshold_s"] = np.array([t for _, t in picked], dtype=np.float64)
    return out
