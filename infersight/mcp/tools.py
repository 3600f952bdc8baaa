"""The MCP tools: each one reads the agent's JSON API (agent_client) and returns a typed result
(results.py). Bad arguments fail the tool's input schema or raise ToolError: the client gets an
isError result with one line, and the server goes on. Descriptions are short: an agent chooses by them.
"""
from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from infersight.mcp import results as R
from infersight.mcp.agent_client import AgentClient, AgentError
from infersight.mcp.config import McpConfig

SUMMARY_PROVENANCE = {
    "requests, ttft_seconds, e2e_seconds, itl_mean_seconds, phases_seconds_total, slow_causes":
        "measured: probe timestamps of the kept finished requests (engine monotonic clock)",
    "prefix_cache, kv, dropped_events, lost_events": "measured: probe record counts",
    "engine_seconds_by_task": "modelled: each request's token share of its steps' measured wall-clock time",
    "energy_j_by_task": "modelled split of measured energy (the GPU energy counter over each step)",
}
ROW_PROVENANCE = {
    "queue_s, prefill_s, preemption_stall_s, decode_s, network_s, e2e_s, ttft_s, itl_mean_s":
        "measured: probe timestamps",
    "engine_seconds": "modelled: the request's token share of its engine steps' wall-clock time (not GPU time)",
    "energy_j, gpu_sm_active_s": "modelled split of measured energy / SM activity (null without a GPU counter)",
    "energy_sampling_bound_j": "modelled: the most the counter's sampling can have moved into or out of energy_j",
    "gpu_kernel_s": "measured: kernel time of a profiler capture, split by tokens (null when none covered it)",
    "slow_cause, slow_detail": "modelled: the slow-request attribution's rule over the measured parts",
}
ROOFLINE_NOTE = ("roofline: modelled work (FLOPs and bytes from the model's shapes) over measured kernel time, "
                 "against ceilings labelled measured, datasheet or given; category shares are measured kernel time")
SPEC_PROVENANCE = {"accept_rate, mean_accepted_length": "measured: verification probe records",
                   "predicted_speedup, speedup_interval": "modelled: predicted from measured step times "
                                                          "(see each task's basis and how)"}
EXPERT_PROVENANCE = {"tokens, max_over_mean, cv, hot_cold_ratio": "measured: MoE routing probe records (token counts)",
                     "expert_parallel": "measured loads and a modelled replication plan (balance_after: predicted)"}
KV_PROVENANCE = {"preemptions, evictions, offloads, reloads, recomputed_tokens, blocks_*":
                     "measured: KV block and step probe records",
                 "by_task_pair, recent_evictions": "measured: EVICTED records joined to the block's last CACHED record"}
CAPTURE_PROVENANCE = {"analysis": "measured kernel times from the profiler's trace; roofline rows: modelled work over "
                                  "measured time"}


def _tool_error(exc: AgentError) -> ToolError:
    return ToolError(str(exc))


def _row(doc: dict[str, Any]) -> dict[str, Any]:
    """The API's row with its text fields as text (a null trace id or task is '')."""
    return {**doc, **{k: doc.get(k) or "" for k in ("trace_id", "task", "finish_reason", "slow_cause", "slow_detail")}}


def register_tools(server: MCPServer, agent: AgentClient, config: McpConfig) -> None:
    async def get(path: str, **params: Any) -> Any:
        try:
            return await agent.get(path, **params)
        except AgentError as exc:
            raise _tool_error(exc) from None

    @server.tool(description="Headline numbers: requests, TTFT/e2e/ITL p50 and p99, phase totals, prefix "
                             "cache, KV, slow causes, cost by task.")
    async def summary() -> R.Summary:
        s = await get("/api/v1/summary")
        return R.Summary(**{k: s[k] for k in R.Summary.model_fields if k in s},
                         engine_seconds_by_task=s["cost"]["engine_seconds_by_task"],
                         energy_j_by_task=s["cost"]["energy_j_by_task"], provenance=SUMMARY_PROVENANCE)

    @server.tool(description="The N slowest finished requests (by e2e) with their decomposition, slow cause and "
                             "the numbers behind it.")
    async def slowest_requests(n: Annotated[int, Field(ge=1, le=1000, description="how many")] = 10,
                               only_slow: Annotated[bool, Field(description="only those judged slow")] = False
                               ) -> R.SlowestRequests:
        doc = await get("/api/v1/requests", slowest=n)
        s = await get("/api/v1/summary")
        rows = [R.RequestRow(**_row(r)) for r in doc["requests"] if r.get("slow_cause") or not only_slow]
        return R.SlowestRequests(requests=rows, slow_rule=s["slow_rule"], provenance=ROW_PROVENANCE)

    @server.tool(description="One finished request explained: TTFT parts, cause, its engine steps, kernels when "
                             "captured, energy and engine seconds with how each was obtained.")
    async def explain_request(request_id: Annotated[int, Field(ge=0, description="the engine's request id")]
                              ) -> R.RequestExplained:
        doc = await get(f"/api/v1/requests/{request_id}")
        spans = (f"trace id {doc['trace_id']}: the request's span and its step spans, in the OTLP backend the agent "
                 f"exports to (--otlp-endpoint), when tracing is on")
        return R.RequestExplained(**_row(doc), spans=spans, provenance={**ROW_PROVENANCE, **doc.get("bases", {})})

    @server.tool(description="What limits the engine: findings, speculation advice and the roofline (recorder "
                             "windows and captures).")
    async def diagnosis() -> R.Diagnosis:
        d = await get("/api/v1/diagnosis")
        s = await get("/api/v1/summary")
        caps = await get("/api/v1/captures")
        recorder = s.get("flight_recorder") or {}
        roof = [R.CaptureRoofline(capture_id=c["capture_id"], ring=c["ring"], rows=c["analysis"]["roofline"],
                                  ceilings=c["analysis"].get("ceilings"))
                for c in caps["captures"] if isinstance(c.get("analysis"), dict) and c["analysis"].get("roofline")]
        findings = [R.Finding(kind=f["kind"], message=f["message"],
                              details={k: v for k, v in f.items() if k not in ("kind", "message")})
                    for f in d["findings"]]
        roofline = R.Roofline(last_window_category_shares=recorder.get("last_window_category_shares", {}),
                              windows_measured=recorder.get("windows_measured"), captures=roof,
                              note=ROOFLINE_NOTE if recorder or roof else
                              "no roofline yet: no flight recorder window and no analysed capture")
        return R.Diagnosis(findings=findings,
                           speculation_recommendations=[R.SpecAdvice(**r) for r in d["speculation_recommendations"]],
                           roofline=roofline,
                           dropped_events=d["dropped_events"],
                           provenance={"findings": "from measured figures (see summary)",
                                       "speculation_recommendations": "modelled: from the predicted speedup's interval",
                                       "roofline": ROOFLINE_NOTE})

    @server.tool(description="Speculative decoding by task: acceptance, predicted speedup with its interval, and "
                             "the advice.")
    async def speculation() -> R.Speculation:
        s = await get("/api/v1/summary")
        d = await get("/api/v1/diagnosis")
        advice = {r["task"]: r for r in d["speculation_recommendations"]}
        tasks = [R.SpecTask(task=task, **{k: v for k, v in t.items() if k in R.SpecTask.model_fields},
                            advice=advice.get(task, {}).get("action"), advice_reason=advice.get(task, {}).get("reason"))
                 for task, t in sorted(s["spec"]["by_task"].items())]
        return R.Speculation(tasks=tasks, provenance=SPEC_PROVENANCE)

    @server.tool(description="MoE expert load per layer and its imbalance (max/mean, CV, hottest expert); "
                             "expert-parallel ranks when present.")
    async def expert_load() -> R.ExpertLoad:
        s = await get("/api/v1/summary")
        matrix = s["moe"]["expert_tokens"]
        layers = []
        for layer in s["moe"]["layers"]:
            tokens = [int(v) for v in matrix[layer["layer"]]] if layer["layer"] < len(matrix) else []
            hottest = max(range(len(tokens)), key=tokens.__getitem__) if tokens else None
            layers.append(R.LayerLoad(**layer, hottest_expert=hottest, tokens=tokens))
        return R.ExpertLoad(layers=layers, expert_parallel=s.get("expert_parallel"), provenance=EXPERT_PROVENANCE)

    @server.tool(description="KV cache pressure: preemptions, evictions, offloads, recomputed tokens, usage, and "
                             "who evicted whom (by task, and the latest evictions).")
    async def kv_pressure(recent: Annotated[int, Field(ge=0, le=1000, description="latest evictions to list")] = 20
                          ) -> R.KvPressure:
        kv = (await get("/api/v1/summary"))["kv"]
        ev = await get("/api/v1/kv/evictions", limit=recent)
        total = kv.get("blocks_total")
        return R.KvPressure(**kv, usage=kv["blocks_in_use"] / total if total else None,
                            evictions_logged=ev["evictions_total"],
                            by_task_pair=[R.TaskPair(**p) for p in ev["by_task_pair"]],
                            recent_evictions=[R.Eviction(**{k: e[k] for k in R.Eviction.model_fields})
                                              for e in ev["recent"]],
                            provenance=KV_PROVENANCE)

    @server.tool(description="Start a profiler capture of the engine's next N steps (needs the agent's token); "
                             "read it with `captures`.")
    async def start_capture(steps: Annotated[int, Field(ge=1, le=1000)] = 20,
                            tool: Literal["torch", "cuda-profiler"] = "torch") -> R.Capture:
        from infersight.agent.api.token_file import TokenFileError, read_token

        path = config.resolved_token_file()
        try:
            token = read_token(path)
        except TokenFileError as exc:
            raise ToolError(f"no capture token: {exc} (pass --token-file)") from None
        try:
            record = await agent.post("/api/v1/capture", {"steps": steps, "tool": tool}, token)
        except AgentError as exc:
            raise _tool_error(exc) from None
        return R.Capture(**record)

    @server.tool(description="Captures so far with their kernel analysis (categories, roofline, findings) once "
                             "written; one by id if given.")
    async def captures(capture_id: Annotated[int | None, Field(ge=0)] = None) -> R.Captures:
        doc = await get("/api/v1/captures")
        records = [R.Capture(**c) for c in doc["captures"] if capture_id is None or c["capture_id"] == capture_id]
        if capture_id is not None and not records:
            raise ToolError(f"no capture {capture_id} (the agent has {len(doc['captures'])})")
        return R.Captures(captures=records, provenance=CAPTURE_PROVENANCE)

    @server.tool(description="Compare two time windows (requests finished in each): latency p50/p99, phases, "
                             "causes, and each p50's change with a 95% interval. Times: Unix seconds, or <= 0 for "
                             "seconds before now (e.g. -600,-300 vs -300,0).")
    async def compare_windows(a_start: float, a_end: float, b_start: float, b_end: float) -> R.WindowComparison:
        now = time.time()  # this machine's clock: the agent's, when both run on one host

        def window(start: float, end: float) -> str:
            return ",".join(repr(v + now if v <= 0 else v) for v in (start, end))

        doc = await get("/api/v1/compare", a=window(a_start, a_end), b=window(b_start, b_end))
        return R.WindowComparison(**{k: v for k, v in doc.items() if k != "basis"}, provenance=doc["basis"])
