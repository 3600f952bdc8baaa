"""build_server: one MCPServer with infersight's tools and resources in front of an agent; serve: run
it over stdio (the default: the client spawns `infersight mcp`) or streamable HTTP behind the
agent's bearer token (BearerGuard), on a loopback port by default."""
from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from infersight.mcp.agent_client import AgentClient
from infersight.mcp.config import McpConfig
from infersight.mcp.decision_tools import register_decision_tools
from infersight.mcp.resources import register_resources
from infersight.mcp.tools import register_tools

INSTRUCTIONS = ("infersight observes an LLM inference engine. Start with `summary`, then `slowest_requests` "
                "and `explain_request` for latency, `diagnosis` for what limits the engine, `speculation`, "
                "`expert_load` and `kv_pressure` for the engine's own mechanisms, `compare_windows` for a "
                "before/after, `decisions` for what the agent's closed loop changed and why. Every figure says whether it was measured or modelled (`provenance`).")


def build_server(config: McpConfig) -> MCPServer:
    server = MCPServer("infersight", instructions=INSTRUCTIONS, log_level="WARNING")
    register_tools(server, AgentClient(config.agent_url, config.timeout_s), config)
    register_decision_tools(server, AgentClient(config.agent_url, config.timeout_s))
    register_resources(server)
    return server


def serve(config: McpConfig) -> None:
    if config.transport == "stdio":
        build_server(config).run("stdio")
        return
    import uvicorn

    from infersight.agent.api.token_file import read_token
    from infersight.mcp.bearer_guard import BearerGuard

    token = read_token(config.resolved_token_file())  # a one-line refusal (ValueError) when it cannot be trusted
    app = BearerGuard(build_server(config).streamable_http_app(host=config.host), token)
    uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning")).run()
