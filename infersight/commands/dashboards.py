"""`infersight dashboards`: write the Grafana dashboards and their provisioning files."""
from __future__ import annotations

import argparse

from infersight.dashboards.settings import DEFAULT_DATASOURCE_UID, DEFAULT_PROMETHEUS_URL, DEFAULT_SCRAPE_INTERVAL


def run(args: argparse.Namespace) -> int:
    from infersight.dashboards.grafana import write_dashboards
    from infersight.dashboards.grafana.provisioning import ProvisioningConfig

    config = ProvisioningConfig(prometheus_url=args.prometheus_url, datasource_uid=args.datasource_uid,
                                scrape_interval=args.scrape_interval, dashboards_path=args.dashboards_path or "",
                                traces_datasource_uid=args.traces_datasource_uid)
    for path in write_dashboards(args.out, config):
        print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboards", help="write Grafana dashboards (JSON) and provisioning files for them")
    p.add_argument("--out", required=True, help="output directory (dashboards/ and provisioning/ inside)")
    p.add_argument("--prometheus-url", default=DEFAULT_PROMETHEUS_URL,
                   help=f"Prometheus as Grafana's server reaches it (default {DEFAULT_PROMETHEUS_URL})")
    p.add_argument("--datasource-uid", default=DEFAULT_DATASOURCE_UID,
                   help=f"uid of the provisioned datasource every panel queries (default {DEFAULT_DATASOURCE_UID})")
    p.add_argument("--scrape-interval", default=DEFAULT_SCRAPE_INTERVAL,
                   help=f"Prometheus's scrape interval for the agent (default {DEFAULT_SCRAPE_INTERVAL})")
    p.add_argument("--dashboards-path", help="where Grafana's server sees OUT/dashboards (default: its absolute path)")
    p.add_argument("--traces-datasource-uid", help="tracing datasource (e.g. Tempo) that exemplar trace ids link to")
    p.set_defaults(func=run)
