"""`infersight mcp`: a Model Context Protocol server in front of a running agent (infersight.mcp)."""
from __future__ import annotations

import argparse
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from infersight.commands.agent import parse_listen
    from infersight.mcp.config import McpConfig

    host, port = parse_listen(args.listen)
    config = McpConfig(agent_url=args.agent, transport=args.transport, host=host, port=port,
                       token_file=Path(args.token_file) if args.token_file else None, timeout_s=args.timeout)
    from infersight.mcp.server import serve  # the SDK loads after the arguments are known to be good

    serve(config)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="an MCP server (tools and resources for AI agents) in front of a running agent")
    p.add_argument("--agent", default="http://127.0.0.1:9464", help="the agent's URL (default http://127.0.0.1:9464)")
    p.add_argument("--transport", default="stdio", choices=("stdio", "streamable-http"),
                   help="stdio (default: the client spawns this command) or streamable-http (--listen)")
    p.add_argument("--listen", default="127.0.0.1:9465", help="HOST:PORT of streamable-http (default 127.0.0.1:9465)")
    p.add_argument("--token-file", help="the agent's token file: guards streamable-http and allows start_capture "
                                        "(default: the agent's default file for its port)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="bound on each call to the agent (default 10)")
    p.set_defaults(func=run)
