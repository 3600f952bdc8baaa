"""benchmarks/fleet_scale_cost.py at its tiny size, part (a) only: the series it reports per model
shape agree with two counts of the raw scrape (its sample lines, prometheus_client's parser) and
with what the shapes and the default caps imply, worked out here from the shapes alone:

    expert token series  layers x experts while that is within --max-expert-series, else one per expert
    imbalance series     3 per layer (max_over_mean, cv, hot_cold_ratio)
    hot pairs            the top_hot_pairs hottest
    everything else      the same for every shape (a dense model has no MoE series)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import fleet_scale_cost as bench  # noqa: E402

from infersight.exporters import catalogue as C  # noqa: E402
from infersight.exporters.exposition_config import ExpositionConfig  # noqa: E402

IMBALANCE_STATS = 3


def test_series_per_shape_match_the_shapes_and_caps(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    assert bench.main(["--tiny", "--parts", "series", "--out", str(out)]) == 0
    series = json.loads(out.read_text())["series"]
    assert set(series) == set(bench.SHAPES)
    caps = ExpositionConfig()
    dense = series["dense-8b"]
    assert not any(name.startswith(C.P + "moe_") for name in dense["families"])
    for shape, got in series.items():
        assert got["series"] == got["series_parsed"] > 100, shape
        assert got["scrape_bytes_median"] > 50 * got["series"] and got["dropped_slots"] == 0, got
        layers, experts, _ = bench.SHAPES[shape]
        if not experts:
            continue
        expected = {C.EXPERT_TOKENS.name: layers * experts if layers * experts <= caps.max_expert_series else experts,
                    C.MOE_IMBALANCE.name: IMBALANCE_STATS * layers,
                    C.HOT_EXPERT_TOKENS.name: min(caps.top_hot_pairs, layers * experts)}
        assert {k: got["families"].get(k) for k in expected} == expected, shape
        assert got["series"] - dense["series"] == sum(expected.values()), shape
