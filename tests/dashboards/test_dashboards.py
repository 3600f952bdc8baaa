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
from infersight.dashboards.grafana import build_dashboards, engine, fleet, gpu, kernels, overview, to_json
from infersight.dashboards.grafana.provisioning import ProvisioningConfig
from infersight.dashboards.grafana.variables import DATASOURCE_VAR, FILTERS
from infersight.exporters.catalogue.identity import ENGINE_LABEL, engine_labelled
from infersight.exporters import catalogue as C

GRAFANA_DIR = Path(__file__).resolve().parents[2] / "infersight" / "dashboards" / "grafana"
#: PromQL words that look like metric names in an expression but are not.
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "clamp_min", "le", "max", "label_values",
                "e", "inf", "topk", "or", "group_left", "quantile", "abs", "avg_over_time", "label_replace"}
BOARDS = {fleet.UID, overview.UID, engine.UID, gpu.UID, kernels.UID}
#: A series selector with its matchers: name{a=~"x", ...}.
SELECTOR = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}')


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
    assert set(boards) == BOARDS
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
    for spec in (*C.CATALOGUE, *C.IDENTITY_METRICS):
        known |= {spec.sample, spec.name + "_bucket", spec.name + "_sum", spec.name + "_count"}
    exprs = [t["expr"] for b in _boards(written).values() for p in _panels(b) for t in p.get("targets", [])]
    assert len(exprs) > 40
    for board in _boards(written).values():  # template variables: label_values(metric{...}, label)
        for var in board["templating"].get("list", []):
            if var["type"] == "datasource":
                continue
            metric, label = re.fullmatch(r"label_values\((\w+)(?:\{[^}]*\})?, (\w+)\)", var["query"]).groups()
            spec = next(s for s in (*C.CATALOGUE, *C.IDENTITY_METRICS) if s.sample == metric)
            # engine: on an engine family only when one agent reads several rings (catalogue.identity)
            engine = (ENGINE_LABEL,) if engine_labelled(spec) else ()
            assert label in (*spec.exposed_labels, *C.TARGET_LABELS, *engine), (var["name"], label)
    for expr in exprs:
        bare = re.sub(r'"[^"]*"|\[[^\]]*\]|\{[^}]*\}|\$\w+|\b(?:by|ignoring|on|group_left|group_right) ?\([^)]*\)', " ", expr)  # strings, ranges, matchers
        words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)) - PROMQL_WORDS
        assert words <= known, (expr, words - known)


def test_no_metric_name_is_typed_in_the_dashboards_code() -> None:
    for path in GRAFANA_DIR.glob("*.py"):
        assert C.P not in path.read_text(), f"{path.name} types a metric name; derive it from the catalogue"


def test_every_panel_uses_the_datasource_variable_set_to_the_provisioned_one(written: Path) -> None:
    datasource = (written / "provisioning" / "datasources" / "infersight.yaml").read_text()
    assert 'uid: "my-prom"' in datasource and 'url: "http://prometheus:9090"' in datasource
    assert 'datasourceUid: "tempo"' in datasource and 'name: "trace_id"' in datasource
    via_variable = {"type": "prometheus", "uid": "${" + DATASOURCE_VAR + "}"}
    for uid, board in _boards(written).items():
        variables = board["templating"]["list"]
        chooser = variables[0]  # first: every other variable queries through it
        assert (chooser["name"], chooser["type"], chooser["query"]) == (DATASOURCE_VAR, "datasource", "prometheus")
        assert chooser["current"]["value"] == "my-prom", uid  # the provisioned datasource by default
        for panel in _panels(board):
            for ref in [panel.get("datasource"), *(t.get("datasource") for t in panel.get("targets", []))]:
                if panel.get("targets"):
                    assert ref == via_variable, (uid, panel["title"])
        for var in variables[1:]:
            assert var["datasource"] == via_variable
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


def test_every_query_is_filtered_by_every_fleet_variable_its_series_carry(written: Path) -> None:
    """Each catalogue series named in a panel, annotation or variable query carries the matchers of
    the filter variables (model only on the families with the model label); variables are chained
    (each matches the ones before it), all multi-value with All = .* (which matches an absent label)."""
    model_families = {s.sample for s in C.CATALOGUE if C.MODEL_LABEL in s.exposed_labels}
    model_families |= {s.name + x for s in C.CATALOGUE if C.MODEL_LABEL in s.exposed_labels and s.kind == "histogram"
                       for x in ("_bucket", "_sum", "_count")}
    checked = 0
    for uid, board in _boards(written).items():
        exprs = [t["expr"] for p in _panels(board) for t in p.get("targets", [])]
        exprs += [a["expr"] for a in board.get("annotations", {}).get("list", []) if "expr" in a]
        for expr in exprs:
            names = re.findall(r"\b((?:%s|target_info)[A-Za-z0-9_]*)\b(?!\s*[,)])" % C.P, expr)
            selectors = dict(SELECTOR.findall(expr))
            for name in names:
                wanted = [f for f in FILTERS if not f.model_only or name in model_families]
                assert name in selectors, (uid, name, expr[:120])
                for f in wanted:
                    assert f'{f.label}=~"${f.name}"' in selectors[name], (uid, name, f.name)
                checked += 1
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:len(FILTERS) + 1] == [DATASOURCE_VAR, *(f.name for f in FILTERS)], uid
        for i, var in enumerate(board["templating"]["list"][1:len(FILTERS) + 1]):
            assert var["multi"] and var["includeAll"] and var["allValue"] == ".*", var["name"]
            assert all(f'"${f.name}"' in var["query"] for f in FILTERS[:i]), var["query"]
    assert checked > 100


def test_fleet_table_is_sorted_by_its_deviation_column() -> None:
    board = json.loads(to_json(build_dashboards()[fleet.UID]))
    table = next(p for p in board["panels"] if p["title"] == fleet.TABLE_TITLE)
    assert table["type"] == "table" and all(t["format"] == "table" and t["instant"] for t in table["targets"])
    ids = [t["id"] for t in table["transformations"]]
    assert ids == ["merge", "sortBy", "organize"]
    sort = table["transformations"][1]["options"]["sort"]
    renamed = table["transformations"][2]["options"]["renameByName"]
    assert len(sort) == 1 and sort[0]["desc"] and renamed[sort[0]["field"]] == fleet.DEVIATION
