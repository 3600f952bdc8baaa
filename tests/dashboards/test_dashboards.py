"""The generated dashboards: they load back through grafana-foundation-sdk's models unchanged, every
query names only catalogue metrics, every panel queries the provisioned datasource, and the CLI
writes dashboards plus provisioning files that agree on the datasource uid."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel
from grafana_foundation_sdk.models.prometheus import Dataquery

from infersight.cli import main
from infersight.dashboards.grafana import build_dashboards, engine, gpu, kernels, overview, to_json
from infersight.dashboards.grafana.provisioning import ProvisioningConfig
from infersight.exporters import catalogue as C

GRAFANA_DIR = Path(__file__).resolve().parents[2] / "infersight" / "dashboards" / "grafana"
#: PromQL words that look like metric names in an expression but are not.
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "clamp_min", "le", "max", "label_values",
                "e", "inf", "topk", "or", "group_left"}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grafana")
    assert main(["dashboards", "--out", str(out), "--prometheus-url", "http://prometheus:9090",
                 "--datasource-uid", "my-prom", "--traces-datasource-uid", "tempo"]) == 0
    return out


def _boards(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "dashboards").glob("*.json"))}


def _panels(board: dict) -> list[dict]:
    return [p for panel in board["panels"] for p in [panel, *panel.get("panels", [])]]


def test_dashboards_round_trip_through_the_sdk_models(written: Path) -> None:
    """The SDK's load path: register the panel and query plugins, then Dashboard.from_json."""
    register_default_plugins()
    boards = _boards(written)
    assert set(boards) == {overview.UID, engine.UID, gpu.UID, kernels.UID}
    for uid, data in boards.items():
        model = Dashboard.from_json(data)
        assert json.loads(json.dumps(model, cls=JSONEncoder)) == data, uid
        assert model.uid == uid and model.panels
        for panel in model.panels:
            assert isinstance(panel, (Panel, RowPanel))
            for target in getattr(panel, "targets", None) or []:
                assert isinstance(target, Dataquery), (uid, panel.title)  # typed, not an unknown bag


def test_generation_is_deterministic() -> None:
    first = {uid: to_json(d) for uid, d in build_dashboards().items()}
    assert first == {uid: to_json(d) for uid, d in build_dashboards().items()}


def test_every_query_names_only_catalogue_metrics(written: Path) -> None:
    known = set()
    for spec in C.CATALOGUE:
        known |= {spec.sample, spec.name + "_bucket", spec.name + "_sum", spec.name + "_count"}
    exprs = [t["expr"] for b in _boards(written).values() for p in _panels(b) for t in p.get("targets", [])]
    assert len(exprs) > 40
    for board in _boards(written).values():  # template variables: label_values(metric, label)
        for var in board["templating"].get("list", []):
            metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]).groups()
            assert metric in known and label in next(s for s in C.CATALOGUE if s.sample == metric).labels
    for expr in exprs:
        bare = re.sub(r'"[^"]*"|\[[^\]]*\]|\{[^}]*\}|\$\w+|\b(?:by|ignoring|on|group_left|group_right) ?\([^)]*\)', " ", expr)  # strings, ranges, matchers
        words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)) - PROMQL_WORDS
        assert words <= known, (expr, words - known)


def test_no_metric_name_is_typed_in_the_dashboards_code() -> None:
    for path in GRAFANA_DIR.glob("*.py"):
        assert C.P not in path.read_text(), f"{path.name} types a metric name; derive it from the catalogue"


def test_every_panel_uses_the_provisioned_datasource(written: Path) -> None:
    datasource = (written / "provisioning" / "datasources" / "infersight.yaml").read_text()
    assert 'uid: "my-prom"' in datasource and 'url: "http://prometheus:9090"' in datasource
    assert 'datasourceUid: "tempo"' in datasource and 'name: "trace_id"' in datasource
    for uid, board in _boards(written).items():
        for panel in _panels(board):
            for ref in [panel.get("datasource"), *(t.get("datasource") for t in panel.get("targets", []))]:
                if panel.get("targets"):
                    assert ref == {"type": "prometheus", "uid": "my-prom"}, (uid, panel["title"])
        for var in board["templating"].get("list", []):
            assert var["datasource"] == {"type": "prometheus", "uid": "my-prom"}
    provider = (written / "provisioning" / "dashboards" / "infersight.yaml").read_text()
    assert f'path: "{(written / "dashboards").resolve()}"' in provider


def test_latency_panels_ask_for_exemplars() -> None:
    board = json.loads(to_json(build_dashboards()[overview.UID]))
    for title in ("Time to first token", "End-to-end latency", "Inter-token latency"):
        panel = next(p for p in board["panels"] if p["title"] == title)
        assert panel["targets"] and all(t["exemplar"] for t in panel["targets"]), title


def test_gpu_panels_follow_the_catalogue() -> None:
    """One panel per unit group of the GPU block, and every GPU metric queried by one of them."""
    gpu_board = json.loads(to_json(build_dashboards()[gpu.UID]))
    titles = {p["title"] for p in gpu_board["panels"]}
    assert {"GPU activity", "GPU power", "GPU memory", gpu.ENERGY_TITLE, gpu.ENERGY_PER_TOKEN_TITLE} <= titles
    exprs = " ".join(t["expr"] for p in _panels(gpu_board) for t in p.get("targets", []))
    assert all(spec.sample in exprs for spec in C.GPU_METRICS)
    assert all(p["type"] != "text" for b in build_dashboards().values() for p in _panels(json.loads(to_json(b))))


def test_bad_options_are_value_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="http"):
        ProvisioningConfig(prometheus_url="prometheus:9090")
    assert main(["dashboards", "--out", str(tmp_path), "--prometheus-url", "ftp://x"]) == 2
    assert "infersight: error:" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["dashboards", "--out", str(tmp_path / "file")]) == 2
