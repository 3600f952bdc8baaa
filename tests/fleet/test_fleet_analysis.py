"""The fleet view's pure analyses on small inline frames, expected values worked out by hand (the
arithmetic is in the comments), and its config's checks."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from infersight.exporters import catalogue as C
from infersight.fleet.config import FleetConfig
from infersight.fleet.experts import hottest_experts
from infersight.fleet.outliers import outliers, scores
from infersight.fleet.queries import ESTIMATED, FleetQueries
from infersight.fleet.table import mix, node_table


def _table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_scores_are_leave_one_out_modified_z() -> None:
    t = _table([{"node": "a", "model": "m", "queue_share": 1.0}, {"node": "b", "model": "m", "queue_share": 1.2},
                {"node": "c", "model": "m", "queue_share": 6.0}])
    s = scores(t).set_index("node")
    # c against a, b: median 1.1, MAD 0.1, scale max(1.4826 * 0.1, 0.11) = 0.14826; z = 4.9 / 0.14826
    assert s.loc["c", "peer_median"] == pytest.approx(1.1)
    assert s.loc["c", "scale"] == pytest.approx(0.14826)
    assert s.loc["c", "difference"] == pytest.approx(4.9)
    assert s.loc["c", "z"] == pytest.approx(4.9 / 0.14826)
    assert bool(s.loc["c", "flagged"])
    # a against b, c: median 3.6, MAD 2.4, scale max(3.55824, 0.36) = 3.55824
    assert s.loc["a", "z"] == pytest.approx(-2.6 / 3.55824)
    assert not s.loc["a", "flagged"] and not s.loc["b", "flagged"]


def test_a_quantile_is_judged_on_the_smallest_difference_its_buckets_allow() -> None:
    # The same values as an e2e p99 (latency buckets ... 1.0, 2.5, 5.0, 7.5 ...): c's 6.0 lies in (5.0, 7.5],
    # a's 1.0 in (0.75, 1.0], b's 1.2 in (1.0, 2.5]; the peers' median lies below the median of their upper
    # bounds, (1.0 + 2.5) / 2 = 1.75, so c is at least 5.0 - 1.75 = 3.25 above: z = 3.25 / 0.14826
    t = _table([{"node": "a", "model": "m", "e2e_p99_s": 1.0}, {"node": "b", "model": "m", "e2e_p99_s": 1.2},
                {"node": "c", "model": "m", "e2e_p99_s": 6.0}])
    s = scores(t).set_index("node")
    assert s.loc["c", "difference"] == pytest.approx(3.25)
    assert s.loc["c", "z"] == pytest.approx(3.25 / 0.14826) and bool(s.loc["c", "flagged"])
    # a below its peers: its bucket's upper bound 1.0 less the median of theirs' lower bounds, (1.0 + 5.0) / 2
    assert s.loc["a", "difference"] == pytest.approx(1.0 - 3.0)
    # b in (1.0, 2.5]; its peers' median lies in ((0.75 + 5.0) / 2, (1.0 + 7.5) / 2] = (2.875, 4.25]: b is
    # below it by 2.875 - 2.5 = 0.375 at least
    assert s.loc["b", "difference"] == pytest.approx(-0.375)
    # a and b alone, 1.0 in (0.75, 1.0] and 1.2 in (1.0, 2.5]: touching buckets, nothing the buckets can tell
    two = scores(t.iloc[:2]).set_index("node")
    assert list(two["difference"]) == [0.0, 0.0] and list(two["z"]) == [0.0, 0.0]


def test_quantiles_a_bucket_apart_are_not_told_apart() -> None:
    # A suite run's ITL p50s (ms): 9.87, 8.98 in the ITL buckets' (5, 10], 14.44 in (10, 20], the three
    # nodes' e2e p50s within 1%: the latencies sat either side of the 10 ms bound, so c may be 10.01 and
    # a 9.99. Its bucket's lower bound 10 is not above its peers' upper bounds' median 10: no difference.
    t = _table([{"node": "a", "model": "m", "itl_p50_s": 0.00987}, {"node": "b", "model": "m", "itl_p50_s": 0.00898},
                {"node": "c", "model": "m", "itl_p50_s": 0.01444}])
    s = scores(t).set_index("node")
    assert s.loc["c", "difference"] == 0.0 and not s.loc["c", "flagged"]
    # on the readings it was (14.44 - 9.425) / max(1.4826 * 0.445, 0.9425) = 5.3: flagged
    assert (0.01444 - 0.009425) / max(1.4826 * 0.000445, 0.0009425) > 3.5
    # two buckets above, 30 ms in (20, 40]: at least 20 - 10 = 10 ms above; z = 10 / 0.9425 = 10.6
    t.loc[2, "itl_p50_s"] = 0.030
    s = scores(t).set_index("node")
    assert s.loc["c", "difference"] == pytest.approx(0.010)
    assert s.loc["c", "z"] == pytest.approx(0.010 / 0.0009425) and bool(s.loc["c", "flagged"])


def test_each_node_is_read_with_its_own_buckets() -> None:
    # c's histogram has vLLM's ITL bounds (... 0.025, 0.05 ...), a's and b's infersight's (... 0.01, 0.02, 0.04 ...).
    t = _table([{"node": "a", "model": "m", "itl_p50_s": 0.007}, {"node": "b", "model": "m", "itl_p50_s": 0.008},
                {"node": "c", "model": "m", "itl_p50_s": 0.030}])
    vllm = [0.01, 0.025, 0.05, 0.075, 0.1, math.inf]
    buckets = pd.DataFrame([{"node": "c", "model": "m", "column": "itl_p50_s", "le": le} for le in vllm])
    s = scores(t, buckets).set_index("node")
    # c in (0.025, 0.05]: at least 25 - 10 = 15 ms above; on the catalogue's bounds (20, 40] it would be 10
    assert s.loc["c", "difference"] == pytest.approx(0.015)
    assert scores(t).set_index("node").loc["c", "difference"] == pytest.approx(0.010)
    # a, read against c's (0.025, 0.05] and b's (5, 10]: below the median of their lower bounds, 15 ms,
    # by its own bucket's upper bound 10 ms at least: -5 ms
    assert s.loc["a", "difference"] == pytest.approx(0.010 - 0.015)


def test_the_floor_keeps_near_identical_nodes_quiet_and_lower_is_worse_for_hit_rates() -> None:
    t = _table([{"node": "a", "model": "m", "queue_share": 0.10, "prefix_hit_rate": 0.8},
                {"node": "b", "model": "m", "queue_share": 0.10, "prefix_hit_rate": 0.8},
                {"node": "c", "model": "m", "queue_share": 0.13, "prefix_hit_rate": 0.2}])
    s = scores(t).set_index(["node", "column"])
    # MAD of (0.1, 0.1) is 0: the scale is 10% of the median, 0.01; z = 0.03 / 0.01 = 3 (under 3.5)
    assert s.loc[("c", "queue_share"), "z"] == pytest.approx(3.0)
    assert not s.loc[("c", "queue_share"), "flagged"]
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
        # b's e2e p99 in (5.0, 7.5], its peers' in (0.75, 1.0] and (1.0, 2.5]: at least 2.5 s above
        {"node": "b", "model": "m", "e2e_p99_s": 6.0, "preemptions_per_request": 2.0, "queue_share": 0.30},
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
    assert q.bucket_bounds(C.ITL) == ("group by (k8s_node_name, model, le) "
                                      "(last_over_time(infersight_inter_token_latency_seconds_bucket[10m]))")
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
