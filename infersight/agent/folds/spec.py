"""SpecFold: speculative-decoding verifications and step timings, counted and kept in windows.

Counters per task and per draft position; the recent verifications (SPEC_WINDOW) and the steps
that drafted or were plain probes (SPEC_STEP_WINDOW) are kept for the acceptance and measured-
speedup analyses (correlate.speculation, correlate.spec_speedup) and the slow-request attribution.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.agent.rows.row_window import RowWindow
from infersight.correlate import speculation
from infersight.correlate.frames import EventFrames
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter

#: Verifications kept for per-task acceptance and speedup (recent behaviour is what advice needs).
#: 64 B a row: 3.2 MB at 50,000 (100,000 before: part of what put the agent over 150 MB, issue 33).
SPEC_WINDOW = 50_000
#: Timed steps kept for the measured speedup (those that drafted or were plain probes; steps of
#: engines without a draft are not kept).
SPEC_STEP_WINDOW = 50_000


class SpecFold:
    def __init__(self, counters: dict[str, LabelledCounter]) -> None:
        self.counters = counters
        self.window = RowWindow(EventFrames().spec, SPEC_WINDOW)  # recent verifications
        self.step_timing = EventFrames().step_timing  # recent speculative and plain-probe steps

    def fold(self, frame: pd.DataFrame) -> None:
        """Count one batch of verifications (spec frame) and keep them in the window."""
        if frame.empty:
            return
        self.window.append(frame)  # recent verifications only
        tasks, names = pd.factorize(frame["task"], sort=True)  # bincounts: pandas' groupby costs ms per call
        k = len(names)
        for task, proposed, accepted, n in zip(
                names.tolist(), np.bincount(tasks, frame["proposed"].to_numpy(np.int64), minlength=k).tolist(),
                np.bincount(tasks, frame["accepted"].to_numpy(np.int64), minlength=k).tolist(),
                np.bincount(tasks, minlength=k).tolist()):
            self.counters[C.SPEC_DRAFT.name].inc((task,), int(proposed))
            self.counters[C.SPEC_ACCEPTED.name].inc((task,), int(accepted))
            self.counters[C.SPEC_VERIFICATIONS.name].inc((task,), n)
        by_pos = speculation.acceptance_by_position(frame)
        for row in by_pos.itertuples(index=False):
            self.counters[C.SPEC_POSITION_PROPOSED.name].inc((row.task, str(row.position)), row.proposed)
            self.counters[C.SPEC_POSITION_ACCEPTED.name].inc((row.task, str(row.position)), row.accepted)

    def fold_steps(self, frame: pd.DataFrame) -> None:
        """Step timings that the measured speedup needs (correlate.spec_speedup), in a window."""
        frame = frame[frame["spec_probe"] | (frame["spec_tokens"] > 0)]
        if frame.empty:
            return
        old = self.step_timing
        both = pd.concat([old, frame], ignore_index=True) if not old.empty else frame
        self.step_timing = both.iloc[-SPEC_STEP_WINDOW:].reset_index(drop=True)

    @property
    def events(self) -> pd.DataFrame:
        """The last SPEC_WINDOW verifications, one frame (the same object until the next poll adds some)."""
        return self.window.frame()
