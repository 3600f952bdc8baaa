"""The fleet view's pure analyses on small inline frames, expected values worked out by hand (the
arithmetic is in the comments), and its config's checks."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from infersight.fleet.config import FleetConfig
from infersight.fleet.experts import hottest_experts
from infersight.fleet.outliers import outliers, scores
from infersight.fleet.queries import ESTIMATED, FleetQueries
from infersight.fleet.table import mix, node_table


def _table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_scores_are_leave_one_out_modified_z() -> None:
    t = _table([{"node": "a", "model": "m", "e2e_p99_s": 1.0}, {"node": "b", "model": "m", "e2e_p99_s": 1.2},
                {"node": "c", "model": "m", "e2e_p99_s": 6.0}])
    s = scores(t).set_index("node")
    # c against a, b: median 1.1, MAD 0.1; the latency buckets' (1.0, 2.5] holds 1.1, so the scale is
    # max(1.4826 * 0.1, 0.11, 1.5 / 3.5) = 0.428571; z = 4.9 / 0.428571
    assert s.loc["c", "peer_median"] == pytest.approx(1.1)
    assert s.loc["c", "scale"] == pytest.approx(1.5 / 3.5)
    assert s.loc["c", "z"] == pytest.approx(4.9 * 3.5 / 1.5)
    assert bool(s.loc["c", "flagged"])
    # a against b, c: median 3.6, MAD 2.4, scale max(3.55824, 0.36, 2.5 / 3.5 for (2.5, 5.0]) = 3.55824
    assert s.loc["a", "z"] == pytest.approx(-2.6 / 3.55824)
    assert not s.loc["a", "flagged"] and not s.loc["b", "flagged"]
    # the same values in a column that is no histogram's quantile: the MAD's scale, 0.14826
    plain = scores(t.rename(columns={"e2e_p99_s": "queue_share"})).set_index("node")
    assert plain.loc["c", "z"] == pytest.approx(4.9 / 0.14826)


def test_a_quantile_is_flagged_only_a_bucket_above_its_peers() -> None:
    # A suite run's ITL p50s (ms): 6.77, 6.24, 8.85, all in the ITL buckets' (5, 10]: histogram_quantile
    # places each by how many of its ITLs sit below 5 ms, not by a difference it can resolve.
    t = _table([{"node": "a", "model": "m", "itl_p50_s": 0.00677}, {"node": "b", "model": "m", "itl_p50_s": 0.00624},
                {"node": "c", "model": "m", "itl_p50_s": 0.00885}])
    s = scores(t).set_index("node")
    # c against a, b: median 6.505 ms, MAD 0.265; scale max(0.393, 0.6505, 5 / 3.5 = 1.428571) ms
    assert s.loc["c", "scale"] == pytest.approx(0.005 / 3.5)
    assert s.loc["c", "z"] == pytest.approx((0.00885 - 0.006505) * 3.5 / 0.005)  # 1.64
    assert not s.loc["c", "flagged"]
    # without the floor it was (8.85 - 6.505) / 0.6505 = 3.6: flagged
    assert (0.00885 - 0.006505) / (0.1 * 0.006505) > 3.5
    # one bucket above, 12.5 ms in (10, 20]: z = (12.5 - 6.505) / 1.428571 = 4.20, flagged
    t.loc[2, "itl_p50_s"] = 0.0125
    s = scores(t).set_index("node")
    assert s.loc["c", "z"] == pytest.approx((0.0125 - 0.006505) * 3.5 / 0.005) and bool(s.loc["c", "flagged"])


def test_the_floor_keeps_near_identical_nodes_quiet_and_lower_is_worse_for_hit_rates() -> None:
    t = _table([{"node": "a", "model": "m", "ttft_p99_s": 1.00, "prefix_hit_rate": 0.8},
                {"node": "b", "model": "m", "ttft_p99_s": 1.00, "prefix_hit_rate": 0.8},
                {"node": "c", "model": "m", "ttft_p99_s": 1.30, "prefix_hit_rate": 0.2}])
    s = scores(t).set_index(["node", "column"])
    # MAD of (1.0, 1.0) is 0: the scale is 10% of the median, 0.1; z = 0.3 / 0.1 = 3 (under 3.5)
    assert s.loc[("c", "ttft_p99_s"), "z"] == pytest.approx(3.0)
    assert not s.loc[("c", "ttft_p99_s"), "flagged"]
    # hit rate: lower is worse, z = -(0.2 - 0.8) / 0.08 = 7.5
    assert s.loc[("c", "prefix_hit_rate"), "z"] == pytest.approx(7.5)


def test_a_share_of_requests_is_judged_against_its_sampling_noise() -> None:
    # Twelve requests a node; a and b flagged none slow. c flagged one: its peers' median is 0, so
    # p = max(0, 1/12) and the scale sqrt((1/12)(11/12)/12) = 0.079786; z = (1/12) / 0.079786 = 1.0445
    t = _table([{"node": n, "model": "m", "requests": 12.0, "slow_share": k / 12} for n, k in (("a", 0), ("b", 0),
                                                                                                 ("c", 1))])
    s = scores(t).set_index("node")
    assert s.loc["c", "scale"] == pytest.approx(0.079786, rel=1e-4)
    assert s.loc["c", "z"] == pytest.approx(1.0445, rel=1e-4) and not s.loc["c", "flagged"]
    # Six of twelve: z = 0.5 / 0.079786 = 6.267, flagged
    t.loc[2, "slow_share"] = 6 / 12
    assert scores(t).set_index("node").loc["c", "z"] == pytest.approx(6.267, rel=1e-3)
    # Without the request count the share is judged as any column: peers' median and MAD 0, z huge
    assert scores(t.drop(columns="requests")).set_index("node").loc["c", "z"] > 1e9


def test_an_outlier_needs_a_symptom_and_its_cause_is_the_worst_cause_column() -> None:
    t = _table([
        {"node": "a", "model": "m", "e2e_p99_s": 1.0, "preemptions_per_request": 0.0, "queue_share": 0.10},
        {"node": "b", "model": "m", "e2e_p99_s": 5.0, "preemptions_per_request": 2.0, "queue_share": 0.30},
        {"node": "c", "model": "m", "e2e_p99_s": 1.1, "preemptions_per_request": 0.0, "queue_share": 0.11},
        # slow on nothing, but its queue share stands out: no symptom, no outlier
        {"node": "d", "model": "m", "e2e_p99_s": 1.05, "preemptions_per_request": 0.0, "queue_share": 0.9},
    ])
    slow = mix(pd.DataFrame([{"node": "b", "model": "m", "cause": "queue_wait", "count": 3.0},
                             {"node": "b", "model": "m", "cause": "preemption", "count": 1.0}]), "cause")
    out = outliers(scores(t), slow)
    assert list(out["node"]) == ["b"]
    row = out.iloc[0]
    # preemptions: peers (0, 0, 0), scale 1e-12, z = 2e12; queue share: peers (0.1, 0.11, 0.9): median 0.11,
    # MAD 0.01, scale max(0.014826, 0.011); z = 0.19 / 0.014826 = 12.8
    assert row["causes"] == ["preemptions_per_request", "queue_share"]
    assert row["cause"] == "preemption" and row["cause_from"] == "cause column preemptions_per_request"
    assert row["top_slow_cause"] == "queue_wait" and row["top_slow_cause_share"] == pytest.approx(0.75)


def test_without_a_cause_column_the_slow_cause_mix_names_the_cause() -> None:
    t = _table([{"node": n, "model": "m", "itl_p99_s": v} for n, v in (("a", 0.01), ("b", 0.01), ("c", 0.05))])
    slow = mix(pd.DataFrame([{"node": "c", "model": "m", "cause": "batch_interference", "count": 2.0}]), "cause")
    row = outliers(scores(t), slow).iloc[0]
    assert (row["node"], row["cause"], row["cause_from"]) == ("c", "batch_interference", "slow-cause mix")
    none = outliers(scores(t), slow.iloc[0:0]).iloc[0]
    assert none["cause"] == "unexplained" and math.isnan(none["top_slow_cause_share"])


def test_nodes_of_different_models_are_not_compared() -> None:
    t = _table([{"node": "a", "model": "small", "e2e_p99_s": 1.0}, {"node": "b", "model": "small", "e2e_p99_s": 1.0},
                {"node": "c", "model": "large", "e2e_p99_s": 9.0}])
    s = scores(t)
    assert set(s["node"]) == {"a", "b"}  # c has no peer serving its model
    assert outliers(s, mix(pd.DataFrame(columns=["node", "model", "cause", "count"]), "cause")).empty


def test_node_table_pivots_answers_and_joins_agents() -> None:
    answers = pd.DataFrame([
        {"column": "request_rate", "node": "a", "model": "m", "value": 2.0},
        {"column": "e2e_p99_s", "node": "a", "model": "m", "value": float("nan")},
        {"column": "request_rate", "node": "b", "model": "m", "value": 1.0},
    ])
    agents = pd.DataFrame([{"node": "b", "model": "m", "instance": "h:2"},
                           {"node": "b", "model": "m", "instance": "h:1"},
                           {"node": "c", "model": "m", "instance": "h:3"}])
    t = node_table(answers, ["request_rate", "e2e_p99_s", "kv_usage_ratio"], agents)
    assert list(t.columns) == ["node", "model", "instance", "request_rate", "e2e_p99_s", "kv_usage_ratio"]
    assert list(t["node"]) == ["a", "b", "c"]
    assert list(t["instance"]) == ["", "h:1,h:2", "h:3"]
    assert t["request_rate"].tolist()[:2] == [2.0, 1.0] and math.isnan(t["request_rate"].iloc[2])
    assert t["kv_usage_ratio"].isna().all()


def test_hottest_experts_across_nodes() -> None:
    rows = [("a", "0", "1", 30.0), ("b", "0", "1", 10.0), ("a", "0", "2", 5.0), ("b", "0", "2", 25.0),
            ("a", "1", "0", 8.0), ("b", "1", "3", 0.0)]
    tokens = pd.DataFrame([{"node": n, "model": "m", "layer": la, "expert": e, "tokens": v} for n, la, e, v in rows])
    top = hottest_experts(tokens, 2)
    # fleet sums: (0,1) 40, (0,2) 30, (1,0) 8; layer 0 holds 70 tokens
    assert list(zip(top["layer"], top["expert"], top["tokens"])) == [("0", "1", 40.0), ("0", "2", 30.0)]
    assert top["layer_share"].tolist() == pytest.approx([40 / 70, 30 / 70])
    assert list(top["top_node"]) == ["a", "b"] and top["top_node_share"].tolist() == pytest.approx([0.75, 25 / 30])
    assert list(top["nodes"]) == [2, 2]


def test_queries_group_by_the_configured_labels_and_say_what_is_estimated() -> None:
    q = FleetQueries(FleetConfig("http://p:9090", since="10m", node_label="k8s_node_name", model_label="model"))
    cols = {c.column: c for c in q.columns()}
    assert cols["e2e_p99_s"].expr == ("histogram_quantile(0.99, sum by (k8s_node_name, model, le) "
                                      "(rate(infersight_e2e_request_latency_seconds_bucket[10m])))")
    assert cols["e2e_p99_s"].provenance == ESTIMATED and cols["request_rate"].provenance == "measured"
    assert "infersight_preemptions_total[10m]" in cols["preemptions_per_request"].expr


@pytest.mark.parametrize("kwargs, message", [
    ({"prometheus_url": "ftp://x"}, "--prometheus-url"), ({"prometheus_url": "localhost:9090"}, "--prometheus-url"),
    ({"since": "15 minutes"}, "--since"), ({"since": "0m"}, "--since"), ({"node_label": "k8s.node"}, "--node-label"),
    ({"node_label": "model_name"}, "must differ"),
])
def test_config_refuses_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FleetConfig(**{"prometheus_url": "http://127.0.0.1:9090", **kwargs})


def test_since_in_seconds() -> None:
    assert FleetConfig("http://p", since="2h").since_s == 7200
