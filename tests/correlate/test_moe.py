"""expert_load / layer_imbalance / top_pairs on a hand-built moe frame."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.frames import MOE_COLUMNS
from infersight.correlate.moe import expert_load, layer_imbalance, top_pairs


def moe_frame(counts: dict[tuple[int, int], list[int]]) -> pd.DataFrame:
    """counts: (step, layer) -> tokens per expert."""
    rows = [(s, layer, e, n) for (s, layer), per in counts.items() for e, n in enumerate(per)]
    return pd.DataFrame(rows, columns=list(MOE_COLUMNS)).astype(MOE_COLUMNS)


# Layer 0 sums to [8, 2, 0, 6]; layer 1 to [3, 5, 4, 4]; layer 2 never got a token (20 rows).
MOE = moe_frame({(1, 0): [3, 1, 0, 2], (2, 0): [5, 1, 0, 4], (1, 1): [2, 2, 2, 2], (2, 1): [1, 3, 2, 2],
                 (1, 2): [0, 0, 0, 0]})


def test_expert_load_sums_over_steps() -> None:
    load = expert_load(MOE)
    assert list(load.columns) == ["layer", "expert", "tokens"]
    assert load.values.tolist() == [[0, 0, 8], [0, 1, 2], [0, 2, 0], [0, 3, 6], [1, 0, 3], [1, 1, 5],
                                    [1, 2, 4], [1, 3, 4], [2, 0, 0], [2, 1, 0], [2, 2, 0], [2, 3, 0]]


def test_layer_imbalance() -> None:
    imb = layer_imbalance(MOE).set_index("layer")
    assert list(imb.reset_index().columns) == ["layer", "max_over_mean", "cv", "hot_cold_ratio", "tokens"]
    # Layer 0: mean 16/4 = 4, max 8 -> 2; deviations 4,-2,-4,2 -> var 40/4 = 10 -> cv sqrt(10)/4;
    # 10% of 4 experts -> 1 each end: hot 8, cold 0 -> inf.
    assert imb.loc[0, "max_over_mean"] == pytest.approx(2.0)
    assert imb.loc[0, "cv"] == pytest.approx(math.sqrt(10) / 4)
    assert imb.loc[0, "hot_cold_ratio"] == math.inf
    # Layer 1: mean 4, max 5 -> 1.25; deviations -1,1,0,0 -> var 0.5 -> cv sqrt(0.5)/4; hot 5 / cold 3.
    assert imb.loc[1, "max_over_mean"] == pytest.approx(1.25)
    assert imb.loc[1, "cv"] == pytest.approx(math.sqrt(0.5) / 4)
    assert imb.loc[1, "hot_cold_ratio"] == pytest.approx(5 / 3)
    # Layer 2: no tokens: every ratio NaN.
    assert np.isnan(imb.loc[2, ["max_over_mean", "cv", "hot_cold_ratio"]].to_numpy(float)).all()
    assert list(imb.tokens) == [16, 16, 0]


def test_hot_cold_uses_ten_percent_of_experts() -> None:
    # 20 experts with 1..20 tokens: k = 2 per end -> (19 + 20) / 2 / ((1 + 2) / 2) = 13.
    imb = layer_imbalance(moe_frame({(1, 0): list(range(1, 21))}))
    assert imb.loc[0, "hot_cold_ratio"] == pytest.approx(13.0)
    assert imb.loc[0, "max_over_mean"] == pytest.approx(20 / 10.5)


def test_top_pairs() -> None:
    top = top_pairs(MOE, 3)
    assert list(top.columns) == ["layer", "expert", "tokens"]
    assert top.values.tolist() == [[0, 0, 8], [0, 3, 6], [1, 1, 5]]
    # Ties on 4 tokens: lower layer, then lower expert first.
    assert top_pairs(MOE, 5).values.tolist()[3:] == [[1, 2, 4], [1, 3, 4]]


def test_empty_moe() -> None:
    empty = pd.DataFrame({c: pd.Series(dtype=t) for c, t in MOE_COLUMNS.items()})
    assert list(expert_load(empty).columns) == ["layer", "expert", "tokens"] and expert_load(empty).empty
    imb = layer_imbalance(empty)
    assert imb.empty and list(imb.columns) == ["layer", "max_over_mean", "cv", "hot_cold_ratio", "tokens"]
    assert top_pairs(empty, 3).empty
