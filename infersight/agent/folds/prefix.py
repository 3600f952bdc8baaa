"""PrefixFold: prefix-cache lookups counted per task, and per shared-prefix group (bounded)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter


class PrefixFold:
    """groups: group hash -> [requests, cached tokens, prompt tokens], at most 4 x retain_groups
    (then the retain_groups biggest are kept)."""

    def __init__(self, counters: dict[str, LabelledCounter], retain_groups: int) -> None:
        self.counters = counters
        self.retain_groups = retain_groups
        self.groups: dict[int, list[int]] = {}

    def fold(self, frame: pd.DataFrame) -> None:
        """Count one batch of prefix rows."""
        if frame.empty:
            return
        # Per task and per group, not per row: bincounts over factorized codes (first-seen order).
        tasks, task_names = pd.factorize(frame["task"])
        prompt = frame["prompt_tokens"].to_numpy(np.int64)
        cached = frame["cached_tokens"].to_numpy(np.int64)
        k = len(task_names)
        sums = zip(task_names.tolist(), np.bincount(tasks, minlength=k).tolist(),
                   np.bincount(tasks, prompt, minlength=k).tolist(), np.bincount(tasks, cached, minlength=k).tolist(),
                   np.bincount(tasks, cached > 0, minlength=k).tolist())
        for task, n, prompt_sum, cached_sum, hits in sums:
            self.counters[C.PREFIX_QUERIED.name].inc((task,), prompt_sum)
            self.counters[C.PREFIX_HIT.name].inc((task,), cached_sum)
            self.counters[C.PREFIX_REQUESTS.name].inc((task,), n)
            if hits:
                self.counters[C.PREFIX_HIT_REQUESTS.name].inc((task,), hits)
        group_hash = frame["group_hash"].to_numpy(np.uint64)
        grouped = group_hash != 0
        groups, hashes = pd.factorize(group_hash[grouped])
        for gh, n, cached_sum, prompt_sum in zip(hashes.tolist(), np.bincount(groups).tolist(),
                                                 np.bincount(groups, cached[grouped]).tolist(),
                                                 np.bincount(groups, prompt[grouped]).tolist()):
            g = self.groups.setdefault(int(gh), [0, 0, 0])
            g[0] += int(n)
            g[1] += int(cached_sum)
            g[2] += int(prompt_sum)
        if len(self.groups) > 4 * self.retain_groups:  # bounded: keep the biggest groups
            keep = sorted(self.groups.items(), key=lambda kv_: -kv_[1][0])[: self.retain_groups]
            self.groups = dict(keep)
