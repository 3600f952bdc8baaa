"""infersight's MCP server: the agent's findings as Model Context Protocol tools and resources,
for AI agents (`infersight mcp`). A client of a running agent's JSON API, never of its state.

config.py        McpConfig: the agent's URL, the transport, the token file, the HTTP timeout
agent_client.py  AgentClient: the agent's JSON API over HTTP, every call bounded by a timeout
results.py       the tools' typed results (pydantic models: each tool publishes an output schema)
tools.py         the tools: summary, slowest requests, one request, diagnosis, speculation, experts,
                 KV pressure, captures, two windows compared
resources.py     the metric catalogue and the Grafana dashboards as resources
bearer_guard.py  the HTTP transport's door: 401 without the agent's bearer token
server.py        build_server (the tools and resources on one MCPServer) and serve (stdio or HTTP)

May import: agent.api.token_file and http (the token and its check), exporters.catalogue,
dashboards; never the agent's state or service (it runs beside the agent, as a separate process).
"""
