"""ExpertFold: MoE expert load (a layers x experts token matrix) and expert-parallel records.

The matrix grows to the largest layer and expert seen; the record screen (agent.rings.record_limits)
has already refused records beyond the agent's limits, so it stays bounded.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.correlate.frames import EventFrames

#: Expert-parallel records kept (layers x ranks x steps) for the all-to-all share and the replication plan.
EP_WINDOW = 50_000


class ExpertFold:
    def __init__(self) -> None:
        self.expert_tokens = np.zeros((0, 0), dtype=np.int64)
        self.ep_events = EventFrames().ep  # expert-parallel records of recent steps, all ranks

    def fold_moe(self, frame: pd.DataFrame) -> None:
        """Add one batch of moe rows (step, layer, expert, tokens) to the matrix."""
        if frame.empty:
            return
        # Straight from the rows (int64 adds): moe.expert_load's groupby would only pre-sum them.
        layer, expert = frame["layer"].to_numpy(np.int64), frame["expert"].to_numpy(np.int64)
        n_layers, n_experts = int(layer.max()) + 1, int(expert.max()) + 1
        shape = self.expert_tokens.shape
        if shape[0] < n_layers or shape[1] < n_experts:
            grown = np.zeros((max(n_layers, shape[0]), max(n_experts, shape[1])), dtype=np.int64)
            grown[:shape[0], :shape[1]] = self.expert_tokens
            self.expert_tokens = grown
        np.add.at(self.expert_tokens, (layer, expert), frame["tokens"].to_numpy(np.int64))

    def fold_ep(self, frame: pd.DataFrame) -> None:
        """Expert-parallel stats from every rank's ring, kept for a recent window of steps."""
        if frame.empty:
            return
        ep = pd.concat([self.ep_events, frame], ignore_index=True) if not self.ep_events.empty else frame
        self.ep_events = ep.iloc[-EP_WINDOW:].reset_index(drop=True)
