"""The plain time of a task under open arrivals: the second figure of correlate.spec_speedup.

spec_speedup's plain time prices a plain engine at the speculative engine's own schedule: its batch
sizes and the prefills beside each request. That is what a plain engine meets under a closed loop (a client
sends its next request when one ends: `bench speculation`'s fixed batch). When requests arrive on their own
clock (the demo, a server's users) a request meets prefills at the arrival rate, so in proportion to its
lifetime, and by Little's law the engine holds requests in proportion to their lifetime. So, per task, with A
the plain time less what mixed steps add to it, M what they add and S the spec time:

    P = A / (1 - M / S),  Tp read at batch b x sum(P) / sum(S)    (iterated: P enters both)

open_arrivals_speedup = P / spec time. The records do not say which arrival process was served, so the interval
spans both figures. Neither alone held on the demo's load (CPU, 2026-12-05, seeds 0-3: BENCHMARKS.md "The
demo's own load"); the span is the honest statement of what the records can tell.

j is spec_speedup's frame of joined verifications (engine, batch, pure, task, dur_ns, step_draft_ns, _weight,
_tokens, _spec_step_ns, _verify_extra_ns); costs is spec_step_costs.step_costs; plain_f the speed factor of each
verification's time; excess the fitted excess of a plain mixed step over a plain decode step (NaN where unfitted).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.correlate.spec_step_costs import _at_batch, plain_mixed_ns

OPEN_ITERATIONS = 4  # the fixed point moves < 1% after the third (CPU demo load)
MAX_MIXED_SHARE = 0.9  # M / S bounded away from 1, so that P stays finite


def open_arrivals_plain_time(j: pd.DataFrame, costs: pd.DataFrame, plain_f: np.ndarray, excess: np.ndarray
                              ) -> dict[str, float]:
    """Per task, the plain time at a plain engine's own schedule under open arrivals (module docstring):
    P = A / (1 - M / S) with Tp read at batch b x sum(P) / sum(S), iterated to its fixed point. {} where the
    spec time is not positive or P is not finite."""
    eng, b = j["engine"].to_numpy(np.int64), j["batch"].to_numpy(np.float64)
    pure, weight = j["pure"].to_numpy(bool), j["_weight"].to_numpy(np.float64)
    spec_own = weight * np.where(pure, j["_spec_step_ns"], j["dur_ns"])
    ratio, plain = 1.0, pd.Series(dtype=np.float64)
    for _ in range(OPEN_ITERATIONS):
        tp = _at_batch(costs, eng, np.maximum(b * ratio, 1.0), "plain_step_ns") * plain_f
        parts = pd.DataFrame({"task": j["task"].to_numpy(), "A": weight * j["_tokens"].to_numpy() * tp,
                              "M": np.where(pure, 0.0, weight * (plain_mixed_ns(j, tp, excess) - tp)),
                              "S": spec_own}).groupby("task").sum()
        plain = parts["A"] / (1.0 - np.minimum(parts["M"] / parts["S"], MAX_MIXED_SHARE))
        total = float(parts["S"].sum())
        if not total > 0 or not np.isfinite(plain.sum()):
            return {}
        ratio = float(plain.sum()) / total
    return {str(k): float(v) for k, v in plain.items()}
