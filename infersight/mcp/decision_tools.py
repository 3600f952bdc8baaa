"""The `decisions` tool: what the agent's closed loop (`infersight agent --auto-apply`) proposed,
canaried, kept and rolled back, with the reason and the numbers of each; what is in force; and, when
the agent reads a vLLM, the flags to restart it with (each with its measurement or "no measurement yet").
Read from GET /api/v1/decisions; registered beside the other tools (mcp.server)."""
from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from infersight.mcp.agent_client import AgentClient, AgentError

DECISION_PROVENANCE = {
    "proposed.numbers": "modelled: the speculation advice's predicted speedup and interval (basis in each); a "
                        "re-check of a disabled task (trigger 'recheck') predicts nothing, it says how long speculation "
                        "has been off; for max_num_seqs the measured share of recent requests meeting the SLO",
    "kept/rolled_back.numbers": "measured: per-output-token latency of each canary arm's requests (probe timestamps) "
                                "or the SLO share met in alternating windows, each with a 95% bootstrap interval",
    "vllm.flags": "the flags to restart vLLM with; each says its measurement, or 'no measurement yet'",
}


class DecisionEntry(BaseModel):
    decision_id: int
    change_id: int
    stage: str = Field(description="proposed | canaried | kept | rolled_back")
    knob: str = Field(description="speculation | max_num_seqs")
    target: str = Field(description="the task, or 'engine' for max_num_seqs")
    before: Any
    after: Any
    reason: str
    numbers: dict[str, Any]
    policy_seq: int
    wall_time: float


class Decisions(BaseModel):
    auto_apply: str = Field(description="on | off")
    knobs: list[str]
    decisions: list[DecisionEntry]
    counts: dict[str, int]
    in_force: dict[str, Any]
    in_flight: dict[str, int]
    engine_takes_policy: bool | None = None
    vllm: dict[str, Any] | None = Field(None, description="the flags to change on vLLM, when the agent reads one")
    provenance: dict[str, str]


def register_decision_tools(server: MCPServer, agent: AgentClient) -> None:
    @server.tool(description="The closed loop's decisions (proposed, canaried, kept, rolled back) with reasons and "
                             "numbers, what is in force, and vLLM flags to change.")
    async def decisions(limit: Annotated[int, Field(ge=0, le=1000, description="latest decisions to list")] = 100
                        ) -> Decisions:
        try:
            doc = await agent.get("/api/v1/decisions", limit=limit)
        except AgentError as exc:
            raise ToolError(str(exc)) from None
        return Decisions(**{k: v for k, v in doc.items() if k in Decisions.model_fields},
                         provenance=DECISION_PROVENANCE)
