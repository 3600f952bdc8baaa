"""The MCP resources: the metric catalogue (every series the agent exports, with its type, unit,
labels, help and derived PromQL) and the Grafana dashboards (their JSON models, as `infersight
dashboards` writes them). Both are generated from code, not from the live agent.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Callable

from mcp.server.mcpserver import MCPServer

CATALOGUE_URI = "infersight://catalogue"
DASHBOARD_URI = "infersight://dashboards/{uid}"


def catalogue_json() -> str:
    from infersight.exporters.catalogue import CATALOGUE

    return json.dumps({"metrics": [{**asdict(m), "sample": m.sample} for m in CATALOGUE]}, indent=1)


def dashboard_json(uid: str) -> str:
    from infersight.dashboards.grafana import build_dashboards, to_json

    return to_json(build_dashboards()[uid])


def _reader(uid: str) -> Callable[[], str]:
    def read_dashboard() -> str:
        return dashboard_json(uid)
    return read_dashboard


def register_resources(server: MCPServer) -> None:
    server.resource(CATALOGUE_URI, name="metric-catalogue", mime_type="application/json",
                    description="Every metric infersight exports: name, kind, unit, labels, help, PromQL views.")(
        catalogue_json)
    from infersight.dashboards.grafana import MODULES

    for module in MODULES:
        uid = module.UID
        server.resource(DASHBOARD_URI.format(uid=uid), name=f"dashboard-{uid}", mime_type="application/json",
                        description=f"Grafana dashboard {uid} (JSON model).")(_reader(uid))
