"""`infersight mcp` over stdio, spawned by the SDK's own client, in front of the live agent: each tool's
structured result against the agent's JSON API (fetched here, not through the server) and, for counts,
against the engine's own record (its outputs and step stats, the probe calls teed in this process).
This server has no token file: start_capture must be a tool error."""
from __future__ import annotations

from typing import Any

import pytest
from mcp import Client
from mcp_session import over_stdio

from mcp_live_agent import ENV, REPO, LiveAgent
from infersight.exporters.catalogue import CATALOGUE


async def _session(client: Client, agent: LiveAgent) -> dict[str, Any]:
    """Every tool and resource once; results as the client got them (structured content or error text)."""
    slowest_id = agent.api("/api/v1/requests", slowest=1)["requests"][0]["request_id"]
    finish = sorted(agent.tee.finished_wall.values())
    # Split at the widest gap between finishes (several requests can finish in one step, microseconds apart).
    _, at = max((b - a, i) for i, (a, b) in enumerate(zip(finish, finish[1:])))
    mid = (finish[at] + finish[at + 1]) / 2
    calls: dict[str, tuple[str, dict[str, Any]]] = {
        "summary": ("summary", {}), "slowest": ("slowest_requests", {"n": 3}),
        "explain": ("explain_request", {"request_id": slowest_id}), "diagnosis": ("diagnosis", {}),
        "speculation": ("speculation", {}), "experts": ("expert_load", {}), "kv": ("kv_pressure", {"recent": 1000}),
        "compare": ("compare_windows", {"a_start": finish[0] - 60, "a_end": mid, "b_start": mid,
                                        "b_end": finish[-1] + 60}),
        "capture": ("start_capture", {"steps": 2}), "bad_n": ("slowest_requests", {"n": 0}),
        "bad_id": ("explain_request", {"request_id": 999_999}), "bad_type": ("explain_request", {"request_id": "x"}),
        "bad_window": ("compare_windows", {"a_start": 10, "a_end": 5, "b_start": 1, "b_end": 2}),
        "unknown_capture": ("captures", {"capture_id": 12345}),
    }
    out: dict[str, Any] = {"tools": {t.name: t for t in (await client.list_tools()).tools},
                           "expected_windows": (at + 1, len(finish) - at - 1)}
    for key, (name, args) in calls.items():
        result = await client.call_tool(name, args)
        out[key] = (result.is_error, result.content[0].text if result.is_error else result.structured_content)
    out["resources"] = [str(r.uri) for r in (await client.list_resources()).resources]
    out["catalogue"] = (await client.read_resource("infersight://catalogue")).contents[0].text
    return out


@pytest.fixture(scope="module")
def session(live_agent: LiveAgent) -> dict[str, Any]:
    return over_stdio(["--agent", live_agent.url, "--token-file", str(REPO / "no-such-token-file")], ENV, str(REPO),
                      lambda client: _session(client, live_agent))


def ok(session: dict[str, Any], key: str) -> dict[str, Any]:
    is_error, value = session[key]
    assert not is_error, value
    return value


def test_every_tool_has_an_output_schema_and_a_short_description(session) -> None:
    tools = session["tools"]
    assert sorted(tools) == sorted(["summary", "slowest_requests", "explain_request", "diagnosis", "speculation",
                                    "expert_load", "kv_pressure", "start_capture", "captures", "compare_windows",
                                    "decisions"])
    for tool in tools.values():
        assert tool.output_schema and tool.output_schema.get("type") == "object", tool.name
        assert 20 < len(tool.description) < 260, tool.name


def test_summary_is_the_agents_and_counts_every_request(session, live_agent) -> None:
    s, api = ok(session, "summary"), live_agent.api("/api/v1/summary")
    assert s["requests"] == api["requests"] == len(live_agent.work.prompts)
    for key in ("ttft_seconds", "e2e_seconds", "itl_mean_seconds", "phases_seconds_total", "kv", "slow_causes"):
        assert s[key] == api[key], key
    assert s["engine_seconds_by_task"] == api["cost"]["engine_seconds_by_task"]
    assert s["dropped_events"] == 0  # or the raw counts below could not match
    assert any(v.startswith("modelled") for v in s["provenance"].values())
    assert any(v.startswith("measured") for v in s["provenance"].values())


def test_slowest_requests_and_one_request_explained(session, live_agent) -> None:
    rows, api = ok(session, "slowest")["requests"], live_agent.api("/api/v1/requests", slowest=3)["requests"]
    assert [(r["request_id"], r["e2e_s"], r["slow_cause"], r["slow_detail"]) for r in rows] == \
        [(r["request_id"], r["e2e_s"], r["slow_cause"], r["slow_detail"]) for r in api]
    one = ok(session, "explain")
    rid = one["request_id"]
    assert rid == api[0]["request_id"]
    ran_in = [s.step_id for s in live_agent.work.steps if any(r == rid for r, _ in s.batch)]
    assert [s["step_id"] for s in one["steps"]] == ran_in
    out = live_agent.engine.get_output(rid)
    assert one["num_preemptions"] == out.num_preemptions and one["output_tokens"] == len(out.token_ids)
    assert one["provenance"]["engine_seconds"].startswith("modelled")
    assert one["trace_id"] in one["spans"]


def test_diagnosis_speculation_and_experts_are_the_agents(session, live_agent) -> None:
    d, api = ok(session, "diagnosis"), live_agent.api("/api/v1/diagnosis")
    assert [(f["kind"], f["message"]) for f in d["findings"]] == [(f["kind"], f["message"]) for f in api["findings"]]
    assert d["speculation_recommendations"] == api["speculation_recommendations"]
    summary = live_agent.api("/api/v1/summary")
    spec = ok(session, "speculation")
    assert {t["task"]: (t["accept_rate"], t["predicted_speedup"], t["basis"]) for t in spec["tasks"]} == \
        {k: (v["accept_rate"], v["predicted_speedup"], v["basis"]) for k, v in summary["spec"]["by_task"].items()}
    advice = {r["task"]: r["action"] for r in api["speculation_recommendations"]}
    assert {t["task"]: t["advice"] for t in spec["tasks"]} == {t: advice.get(t) for t in summary["spec"]["by_task"]}
    tasks = {rid: task for rid, (_, task) in live_agent.work.prompts.items()}
    raw_rates = live_agent.tee.accept_rate_by_task(tasks)
    assert raw_rates and {t["task"]: t["accept_rate"] for t in spec["tasks"]} == pytest.approx(raw_rates)
    experts = ok(session, "experts")
    assert [layer["tokens"] for layer in experts["layers"]] == summary["moe"]["expert_tokens"]
    assert [layer["tokens"] for layer in experts["layers"]] == live_agent.tee.expert_tokens
    for layer in experts["layers"]:
        assert layer["hottest_expert"] == layer["tokens"].index(max(layer["tokens"]))


def test_kv_pressure_matches_the_probe_calls(session, live_agent) -> None:
    kv = ok(session, "kv")
    expected = live_agent.tee.evictions()
    assert expected, "the workload must evict, or this checks nothing"
    assert kv["evictions"] == kv["evictions_logged"] == len(expected)
    assert [(e["evictor_request_id"], e["victim_request_id"]) for e in kv["recent_evictions"]] == expected
    assert kv["preemptions"] == sum(o.num_preemptions for o in live_agent.work.outputs)
    assert kv["preemptions"] == live_agent.api("/api/v1/summary")["kv"]["preemptions"]


def test_windows_compared_count_the_requests_finished_in_each(session, live_agent) -> None:
    c = ok(session, "compare")
    assert (c["a"]["requests"], c["b"]["requests"]) == session["expected_windows"]
    assert sum(session["expected_windows"]) == len(live_agent.work.prompts)
    assert c["provenance"]["windows"].startswith("measured")


@pytest.mark.parametrize("key,words", [("capture", "no capture token"), ("bad_n", "greater than or equal"),
                                       ("bad_id", "HTTP 404"), ("bad_type", "request_id"),
                                       ("bad_window", "START must be before END"), ("unknown_capture", "no capture")])
def test_bad_arguments_are_tool_errors(session, key: str, words: str) -> None:
    is_error, text = session[key]
    assert is_error and words in text, text


def test_resources_are_the_catalogue_and_the_dashboards(session) -> None:
    import json

    assert "infersight://catalogue" in session["resources"]
    assert {u for u in session["resources"] if u.startswith("infersight://dashboards/")} == {
        "infersight://dashboards/infersight-fleet", "infersight://dashboards/infersight-overview",
        "infersight://dashboards/infersight-engine", "infersight://dashboards/infersight-gpu",
        "infersight://dashboards/infersight-kernels"}
    assert [m["name"] for m in json.loads(session["catalogue"])["metrics"]] == [m.name for m in CATALOGUE]
