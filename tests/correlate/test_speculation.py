"""acceptance_by_task / acceptance_by_position / expected_tokens_per_step (the speedup and the advice:
test_spec_speedup.py, test_spec_advice.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.frames import SPEC_COLUMNS
from infersight.correlate.speculation import acceptance_by_position, acceptance_by_task, expected_tokens_per_step

# (task, proposed, accepted, accept_mask, draft_ns, verify_ns)
ROWS = [
    ("code", 4, 3, 0b0111, 40, 100), ("code", 4, 2, 0b0011, 40, 100), ("code", 4, 0, 0b0000, 40, 100),
    ("code", 2, 1, 0b01, 20, 80),
    ("chat", 3, 3, 0b111, 30, 100), ("chat", 3, 3, 0b111, 30, 100),       # alpha = 1
    ("qa", 4, 0, 0, 300, 100), ("qa", 4, 1, 0b1, 300, 100),               # drafting too expensive
]
SPEC = pd.DataFrame({
    "ts_ns": range(len(ROWS)), "request_id": range(len(ROWS)), "task": [r[0] for r in ROWS],
    "proposed": [r[1] for r in ROWS], "accepted": [r[2] for r in ROWS],
    "accept_mask": np.array([r[3] for r in ROWS], dtype=np.uint64), "draft_ns": [r[4] for r in ROWS],
    "verify_ns": [r[5] for r in ROWS]}).astype(SPEC_COLUMNS)


def test_expected_tokens_per_step() -> None:
    assert expected_tokens_per_step(0.5, 3) == pytest.approx(1.875)   # (1 - 0.5**4) / 0.5
    assert expected_tokens_per_step(0.0, 4) == pytest.approx(1.0)     # only the target's own token
    assert expected_tokens_per_step(1.0, 4) == 5.0                    # every draft + the bonus
    assert expected_tokens_per_step(1 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)  # continuous at 1


def test_acceptance_by_task() -> None:
    t = acceptance_by_task(SPEC).set_index("task")
    assert list(t.reset_index().columns) == ["task", "verifications", "proposed", "accepted", "accept_rate",
                                             "mean_accepted_length", "gamma"]
    assert list(t.index) == ["chat", "code", "qa"]
    # code: proposed 14, accepted 6 -> alpha 3/7; tau = mean(4, 3, 1, 2) = 2.5; gamma 14/4 = 3.5.
    code = t.loc["code"]
    assert (code.verifications, code.proposed, code.accepted) == (4, 14, 6)
    assert [code.accept_rate, code.mean_accepted_length, code.gamma] == pytest.approx([3 / 7, 2.5, 3.5])
    # chat (alpha 1): tau 4 = expected_tokens_per_step(1, 3).
    chat = t.loc["chat"]
    assert [chat.accept_rate, chat.mean_accepted_length, chat.gamma] == pytest.approx([1.0, 4.0, 3.0])
    # qa: alpha 1/8; tau (1 + 2) / 2 = 1.5; gamma 4.
    qa = t.loc["qa"]
    assert [qa.accept_rate, qa.mean_accepted_length, qa.gamma] == pytest.approx([0.125, 1.5, 4.0])


def test_acceptance_by_position() -> None:
    p = acceptance_by_position(SPEC)
    assert list(p.columns) == ["task", "position", "proposed", "accepted", "accept_rate"]
    code = p[p.task == "code"]
    # pos 0: 4 proposed, bit 0 set in 0111, 0011, 01 -> 3.  pos 1: 4 proposed (2 > 1), bit 1 in 0111, 0011 -> 2.
    # pos 2: 3 proposed (the 2-draft row stops), bit 2 in 0111 -> 1.  pos 3: 3 proposed, none -> 0.
    assert code[["position", "proposed", "accepted"]].values.tolist() == [[0, 4, 3], [1, 4, 2], [2, 3, 1], [3, 3, 0]]
    assert list(code.accept_rate) == pytest.approx([0.75, 0.5, 1 / 3, 0.0])
    chat = p[p.task == "chat"]
    assert list(chat.position) == [0, 1, 2] and list(chat.accept_rate) == [1.0, 1.0, 1.0]


def test_empty_spec() -> None:
    empty = SPEC.iloc[:0]
    t = acceptance_by_task(empty)
    assert t.empty and t.dtypes.equals(acceptance_by_task(SPEC).dtypes)
    p = acceptance_by_position(empty)
    assert p.empty and p.dtypes.equals(acceptance_by_position(SPEC).dtypes)
