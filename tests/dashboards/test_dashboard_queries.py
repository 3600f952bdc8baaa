"""Every query of every generated dashboard, run against a real Prometheus that scraped the agent
while a tiny engine served a short demo-like workload, returns data, except the panels only a
sampled GPU feeds (gpu.gpu_fed_titles): those must be exactly the empty ones here, and are checked
on a GPU host by benchmarks/energy_check.py. A panel that gets data nowhere does not exist."""
from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from prometheus_server import (  # noqa: E402
    DEMO_RECORDER, ScrapedRun, measured_cpu_ceilings, query as _query, requires_prometheus, scraped_workload,
)
from query_coverage import sample_names  # noqa: E402

from infersight.dashboards.grafana import engine, fleet, gpu, kernels, overview, write_dashboards  # noqa: E402
from infersight.dashboards.grafana.variables import FILTERS  # noqa: E402
from infersight.exporters import catalogue as C  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = requires_prometheus
JOB = "infersight"
#: What Grafana would put in for its built-in variables (the test queries at one instant).
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
#: Panels without data in this CPU run: the GPU-fed ones, and no other.
GPU_NO_DATA = {(gpu.UID, title): "a CPU run has no GPU to sample" for title in gpu.gpu_fed_titles()}


def substitute(expr: str) -> str:
    """Grafana's variables replaced as Grafana would at query time: built-ins by a typical value,
    template variables ($name, ${name}, ${name:fmt}, [[name]]) by the regex matching everything."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = re.sub(r"\$\{?" + name + r"\}?", value, expr)
    expr = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", ".*", expr)
    assert "$" not in expr, expr
    return expr


@pytest.fixture(scope="module")
def scraped(tmp_path_factory) -> Iterator[ScrapedRun]:
    """A Prometheus URL once it holds scrapes taken after the workload's last event (two scrapes
    after it, so every series has the two samples rate() needs). This CPU's roofline ceilings are
    measured first, as a user would (`infersight bench ceilings`, small sizes, into a cache of the
    test's own; in a child process, whose torch threads then leave the agent's scrapes alone):
    without them the roofline panels rightly stay empty (no ceiling known)."""
    tmp = tmp_path_factory.mktemp("prometheus")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("INFERSIGHT_CEILINGS", str(measured_cpu_ceilings(tmp)))
        with scraped_workload(tmp, "dash", JOB, settle_s=2.0, recorder=DEMO_RECORDER) as run:
            done = _query(run.url, f"sum({C.REQUESTS.sample})")
            assert done and float(done[0]["value"][1]) == len(run.work.prompts)
            yield run


@pytest.fixture(scope="module")
def prometheus(scraped: ScrapedRun) -> str:
    """The Prometheus URL; every dashboard query is evaluated at one instant (`at`), so whether a
    gauge's panel has data does not hang on how long the queries before it took."""
    return scraped.url


@pytest.fixture(scope="module")
def at(scraped: ScrapedRun) -> float:
    """Just after the last successful scrape (the raw `up` samples over the last minute, the newest
    whose value is 1): a scrape the agent misses later (the flight recorder's capture holds it on a
    loaded CPU) marks every series stale, which empties the gauges' panels at a later instant."""
    samples = _query_at(scraped.url, f'up{{job="{JOB}"}}[1m]', time.time())[0]["values"]
    return max(float(t) for t, v in samples if v == "1") + 0.5


def _query_at(url: str, expr: str, at: float) -> list[dict]:
    resp = httpx.get(f"{url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=10)
    body = resp.json()
    assert resp.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


@pytest.fixture(scope="module")
def dashboards(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("dashboards")
    paths = write_dashboards(out)
    return {p.stem: json.loads(p.read_text()) for p in paths if p.suffix == ".json"}


def _targets(board: dict) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, rows' nested panels included."""
    for panel in board["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for target in p.get("targets", []):
                yield p["title"], target["expr"]


def test_every_dashboard_query_returns_data(prometheus: str, at: float, dashboards: dict[str, dict]) -> None:
    assert set(dashboards) == {fleet.UID, overview.UID, engine.UID, gpu.UID, kernels.UID}
    empty: dict[tuple[str, str], list[str]] = {}
    queried = 0
    for uid, board in dashboards.items():
        for title, expr in _targets(board):
            queried += 1
            if not _query_at(prometheus, substitute(expr), at):
                empty.setdefault((uid, title), []).append(expr)
    panels = {(uid, p["title"]) for uid, b in dashboards.items() for p in b["panels"] if p.get("targets")}
    expected = set(GPU_NO_DATA)
    assert expected <= panels, f"GPU panels missing: {expected - panels}"
    assert queried > 40
    unexpected = {k: v for k, v in empty.items() if k not in expected}
    listed = json.dumps({str(k): v for k, v in unexpected.items()}, indent=1)
    assert not unexpected, f"queries without data in Prometheus: {listed}"
    now_has_data = expected - set(empty)
    assert not now_has_data, f"these GPU-fed panels have data on a CPU: {now_has_data}"


def _label_values(exposition: str, label: str) -> set[str]:
    """The values a label has on the agent's own samples (what Prometheus stored, before target labels)."""
    return {smp.labels[label] for fam in text_string_to_metric_families(exposition) for smp in fam.samples
            if label in smp.labels}


def test_template_variable_queries_resolve(scraped: ScrapedRun, dashboards: dict[str, dict]) -> None:
    """label_values(selector, label) variables (Grafana-side functions), with the variables before
    them at "All", list in Prometheus what the one scraped agent really has: its model names (read
    from its /metrics), its target (the port it listens on), the MoE layers of its expert series; and
    no namespace, node or pod, which this one-job scrape config does not set ("All" = .* then
    matches their absence, which test_every_dashboard_query_returns_data relies on)."""
    exposition = httpx.get(f"http://127.0.0.1:{scraped.agent.port}/metrics", timeout=30).text
    expected = {"namespace": set(), "node": set(), "pod": set(), "instance": {f"127.0.0.1:{scraped.agent.port}"},
                C.MODEL_LABEL: _label_values(exposition, C.MODEL_LABEL), "layer": _label_values(exposition, "layer"),
                "engine": _label_values(exposition, "engine")}  # one ring: none
    assert expected[C.MODEL_LABEL] and expected["layer"] and sample_names(exposition)
    seen = set()
    for board in dashboards.values():
        for var in board["templating"].get("list", []):
            if var["type"] == "datasource":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"] if isinstance(var["query"], str)
                             else var["query"]["query"])
            assert m, var
            resp = httpx.get(f"{scraped.url}/api/v1/label/{m.group(2)}/values",
                             params={"match[]": substitute(m.group(1))}, timeout=5).json()
            assert resp["status"] == "success", resp
            assert set(resp["data"]) == expected[m.group(2)], (var["name"], resp["data"])
            seen.add(var["name"])
    assert seen == {*(f.name for f in FILTERS), engine.LAYER_VAR}


def test_substitution() -> None:
    expr = 'sum(rate(x{layer=~"$layer", t=~"${task:regex}"}[$__rate_interval])) + increase(y[$__range]) [[z]]'
    assert substitute(expr) == 'sum(rate(x{layer=~".*", t=~".*"}[1m])) + increase(y[5m]) .*'


def test_annotation_queries_return_data(prometheus: str, at: float, dashboards: dict[str, dict]) -> None:
    """The Kernels dashboard marks the recorder's triggered captures; the workload triggers one."""
    exprs = [a["expr"] for b in dashboards.values() for a in b.get("annotations", {}).get("list", []) if "expr" in a]
    assert len(exprs) == 1
    for expr in exprs:
        got = _query_at(prometheus, substitute(expr), at)
        assert [r["metric"].get("reason") for r in got] == ["preemption_storm"], (expr, got)
