"""`infersight fleet`: which node is slow and why, from the Prometheus that holds every node's series
(PromQL only). Prints the node x model table, the outliers with their evidence and cause, and a link
to the outlier agent's slowest requests."""
from __future__ import annotations

import argparse
import sys

from infersight.commands.numeric_flags import bounded_float, bounded_int


def run(args: argparse.Namespace) -> int:
    from infersight.fleet import FleetConfig, PrometheusAPI, PrometheusError, build_report
    from infersight.fleet.render import RENDERERS

    config = FleetConfig(prometheus_url=args.prometheus_url, since=args.since, node_label=args.node_label,
                         model_label=args.model_label, agent_scheme=args.agent_scheme, slowest=args.slowest,
                         top_experts=args.top_experts, timeout_s=args.timeout_s)
    try:
        report = build_report(PrometheusAPI(config.prometheus_url, config.timeout_s), config)
    except PrometheusError as exc:
        print(f"infersight fleet: error: {exc}", file=sys.stderr)
        return 1
    print(RENDERERS[args.format](report))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fleet", help="the fleet from one Prometheus: a node x model table, the outlier nodes "
                                     "and why, the hottest experts (PromQL only)")
    p.add_argument("--prometheus-url", required=True, metavar="URL",
                   help="the Prometheus (or Thanos Query, Mimir) holding every node's series")
    p.add_argument("--since", default="15m", metavar="DURATION",
                   help="the window every figure covers, ending now (a Prometheus duration; default 15m)")
    p.add_argument("--format", choices=("text", "json", "html"), default="text")
    p.add_argument("--node-label", default="node",
                   help="the label naming a node (default node: an agent-mode Prometheus' external label)")
    p.add_argument("--model-label", default="model_name", help="the label naming the model (default model_name)")
    p.add_argument("--agent-scheme", choices=("http", "https"), default="http",
                   help="scheme of the agent's instance (HOST:PORT) in the slowest-requests link")
    p.add_argument("--slowest", type=bounded_int(1, 1000), default=20, metavar="N",
                   help="N in the outlier's /api/v1/requests?slowest=N link (default 20)")
    p.add_argument("--top-experts", type=bounded_int(1, 1000), default=10, metavar="N",
                   help="hottest (layer, expert) pairs listed (default 10)")
    p.add_argument("--timeout-s", type=bounded_float(0.0, 300.0, low_open=True), default=10.0, metavar="SECONDS",
                   help="one query's HTTP timeout (default 10)")
    p.set_defaults(func=run)
