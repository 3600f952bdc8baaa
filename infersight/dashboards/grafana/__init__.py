"""Grafana dashboards for infersight, built with grafana-foundation-sdk from the metric catalogue.

`build_dashboards` returns the SDK models; `write_dashboards` writes them as JSON with the
provisioning files that load them:

    OUT/dashboards/<uid>.json                    one file per dashboard
    OUT/provisioning/datasources/infersight.yaml the Prometheus datasource (uid shared by all panels)
    OUT/provisioning/dashboards/infersight.yaml  a file provider over OUT/dashboards
"""
from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from infersight.dashboards.grafana import engine, fleet, gpu, kernels, overview
from infersight.dashboards.grafana.panels import PanelKit
from infersight.dashboards.grafana.provisioning import ProvisioningConfig, dashboards_yaml, datasource_yaml
from infersight.dashboards.settings import DEFAULT_DATASOURCE_UID

#: Dashboard modules, in the order a reader goes from symptoms to causes (which node, then inside it).
MODULES = (fleet, overview, engine, gpu, kernels)


def build_dashboards(datasource_uid: str = DEFAULT_DATASOURCE_UID) -> dict[str, Dashboard]:
    """uid -> dashboard model; every target queries the datasource with this uid."""
    kit = PanelKit(datasource_uid)
    boards = {}
    for module in MODULES:
        board = module.build(kit).build()
        # The builders leave ids unset (rows get 0); Grafana needs them unique within a dashboard
        # to keep repeats, links and edits to the right panel.
        for i, panel in enumerate(board.panels or [], start=1):
            panel.id_val = i
        boards[module.UID] = board
    return boards


def to_json(dashboard: Dashboard) -> str:
    """The dashboard as Grafana's JSON model (the SDK's encoder), stable key order for diffs."""
    return json.dumps(dashboard, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def write_dashboards(out_dir: str | Path, config: ProvisioningConfig | None = None) -> list[Path]:
    """Write every dashboard and both provisioning files under out_dir; returns the paths written."""
    config = config or ProvisioningConfig()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    boards = out / "dashboards"
    datasources = out / "provisioning" / "datasources"
    providers = out / "provisioning" / "dashboards"
    for d in (boards, datasources, providers):
        d.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, dashboard in build_dashboards(config.datasource_uid).items():
        path = boards / f"{uid}.json"
        path.write_text(to_json(dashboard))
        written.append(path)
    written.append(datasources / "infersight.yaml")
    written[-1].write_text(datasource_yaml(config))
    written.append(providers / "infersight.yaml")
    written[-1].write_text(dashboards_yaml(config, str(boards.resolve())))
    return written
