"""The HTTP door every infersight server shares (the agent, the OTLP receiver, `infersight serve`):
limits on headers, bodies and JSON nesting, the connection bound, bounded gzip/deflate decoding.

limits.py       HttpLimits and LimitedApp: the ASGI wrapper and uvicorn options each server uses
protocol.py     the h11 protocol with a header-read deadline (re-exported by limits)
connections.py  the bound on open connections (one more: 503 and closed), counted
inflate.py      gzip/deflate bodies decoded within bounded work
bearer.py       the bearer-token check (the agent's captures, `infersight mcp` over HTTP)

May import: exporters.catalogue (the metric names it counts under) and nothing else of ours: the
servers (agent, tracing.receiver, serve, mcp) import it, never the other way.
"""
