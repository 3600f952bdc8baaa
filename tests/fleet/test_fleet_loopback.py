"""The loopback fleet (loopback_fleet.py: three nodes, each engine + agent + agent-mode Prometheus,
remote-writing to one central Prometheus that loads infersight's rule files; Phoenix for traces),
started once and shared by every check:

- the preemption-storm alert holds for the slow node only (the rule files Prometheus loaded, read
  back from its rules API and evaluated there);
- one app trace fanned out to two nodes is one trace in Phoenix, the two engines' spans told apart;
- every dashboard query, its template variables substituted as Grafana does (each node alone, and
  "All"), has data for each node from the central Prometheus (the GPU panels have none on a CPU,
  the kernel panels need the flight recorder, off here: loopback_fleet says why); the variables
  list the fleet's nodes, model and agents; the fleet overview's table lists the slow node first;
- `infersight fleet` names the slow node and its cause, and links to its agent's slowest requests;
  it judges each node's quantiles at the bucket bounds that node's agent exposes.

The expected node is loopback_fleet.SLOW_NODE, the one given the small KV pool: never read from
the code under test. Without Prometheus or Phoenix a skip, under CI=true a failure.
"""
from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboards"))  # query_coverage, shared
from grafana_emulation import substitute, table_rows  # noqa: E402
from loopback_fleet import (  # noqa: E402
    JOB, MODEL, NODES, REQUESTS_PER_NODE, SCRAPE_S, SLOW_KV_BLOCKS, SLOW_NODE, KV_BLOCKS, Central, FleetRun, Node,
    complete, drive_load, fan_out, requires_prometheus,
)
from phoenix_server import phoenix_spans  # noqa: E402  (the session's Phoenix: tests/conftest.py's `phoenix`)
from query_coverage import query_coverage, sample_names  # noqa: E402
from testkit import require_service  # noqa: E402

from infersight.cli import main  # noqa: E402
from infersight.dashboards.grafana import fleet as fleet_board, gpu, kernels, write_dashboards  # noqa: E402
from infersight.exporters import catalogue as C  # noqa: E402
from infersight.fleet.config import FleetConfig  # noqa: E402
from infersight.fleet.outliers import Z_CUT  # noqa: E402
from infersight.fleet.prometheus_api import PrometheusAPI  # noqa: E402
from infersight.fleet.report import build_report  # noqa: E402

pytestmark = requires_prometheus
PREEMPTION_ALERT = "InfersightPreemptionStorm"
WINDOW = "5m"  # longer than the run: every rate and quantile covers all of it


def _settled(central: Central, sent: dict[str, int]) -> bool:
    """Every node's finished requests are in the central store, from a scrape taken after the last."""
    done = central.query(f"sum by (node) ({C.REQUESTS.sample})")
    return {r["metric"].get("node"): float(r["value"][1]) for r in done} == {k: float(v) for k, v in sent.items()}


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRun]:
    started, phoenix_missing = time.monotonic(), ""
    work = tmp_path_factory.mktemp("fleet")
    central = Central(work / "central")
    central.work.mkdir()
    nodes = {}
    for name in NODES:
        (work / name).mkdir()
        nodes[name] = Node(name, SLOW_KV_BLOCKS if name == SLOW_NODE else KV_BLOCKS, work / name)
    try:
        rules = central.start()
        for node in nodes.values():
            node.start_engine()
        try:  # Phoenix starts while the engines load; without it the other checks still run
            phoenix_url: str | None = request.getfixturevalue("phoenix")
        except (pytest.skip.Exception, pytest.fail.Exception) as exc:
            phoenix_url, phoenix_missing = None, str(exc)
        for node in nodes.values():
            node.wait_engine()
            node.start_agent(phoenix_url)
        for node in nodes.values():
            node.wait_agent()
            node.start_prometheus_agent(central.url)
        for node in nodes.values():
            node.wait_prometheus_agent()
        deadline = time.monotonic() + 60
        while len(central.query(f'up{{job="{JOB}"}} == 1')) < len(nodes):  # forwarded by every agent-mode one
            assert time.monotonic() < deadline, "the agent-mode Prometheus servers did not forward `up`"
            time.sleep(0.2)
        # One request per task on each node first, in the central store before the load: every latency
        # series then has a sample from before it, so rate() sees the load's requests even on a node that
        # serves all of them inside one scrape interval (a series born after them holds no increase:
        # its p99 would be NaN). What they observed is in that first sample, not in the window's increase.
        warm = {name: sum(1 for i in (REQUESTS_PER_NODE, REQUESTS_PER_NODE + 1)
                          if complete(node.serve_url, i)) for name, node in nodes.items()}
        deadline = time.monotonic() + 60
        while not _settled(central, warm):
            assert time.monotonic() < deadline, f"the central Prometheus did not get the warm-up requests: {warm}"
            time.sleep(0.5)
        # (the slow node's load last: an earlier guess at why a healthy node was flagged on ITL p50; the
        # cause was the judge telling apart quantiles its histogram buckets cannot, fleet.outliers. Rounds
        # of CONCURRENCY with the nodes interleaved were tried: the slow node's queue drained between
        # rounds, and its TTFT p50 fell to 0.09 s beside its peers' 0.06 and 0.09)
        sent = drive_load(sorted(nodes.values(), key=lambda n: n.name == SLOW_NODE))
        for name, n in warm.items():
            sent[name] += n
        trace: dict[str, object] = {"missing": phoenix_missing}
        if phoenix_url is not None:
            trace = fan_out(phoenix_url, [nodes["node-a"], nodes[SLOW_NODE]])
            for name in trace["nodes"]:  # type: ignore[union-attr]
                sent[name] += 1
        deadline = time.monotonic() + 60
        while not _settled(central, sent):
            assert time.monotonic() < deadline, f"the central Prometheus did not get every request: {sent}"
            time.sleep(0.5)
        time.sleep(3 * SCRAPE_S)  # two more scrapes of every series: rate() has its last two samples
        yield FleetRun(central, nodes, rules, phoenix_url, sent, trace, started)
    finally:
        for node in nodes.values():
            node.stop()
        central.stop()


def _instances(central: Central) -> dict[str, str]:
    """The agent target (instance) each node's series came from, as the central store holds them."""
    return {r["metric"]["instance"]: r["metric"]["node"]
            for r in central.query(f'group by (node, instance) ({C.STEPS.sample})')}


def test_the_preemption_alert_holds_for_the_slow_node_only(fleet: FleetRun) -> None:
    """The alert as the central Prometheus loaded it from `infersight rules`' files: its expression
    evaluated there has one series, the slow node's, and Prometheus holds it pending (`for: 5m`
    has not passed in this run) for that node alone."""
    groups = httpx.get(f"{fleet.central.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    files = {Path(g["file"]).name for g in groups}
    assert files == {p.name for p in fleet.rules_dir.glob("*.rules.yml")}
    rule = next(r for g in groups for r in g["rules"] if r.get("name") == PREEMPTION_ALERT)
    instances = _instances(fleet.central)
    assert sorted(instances.values()) == sorted(NODES)
    firing = fleet.central.query(rule["query"])
    assert [instances[r["metric"]["instance"]] for r in firing] == [SLOW_NODE], firing
    deadline = time.monotonic() + 30
    while True:  # the rule group is evaluated every second
        alerts = [a for a in httpx.get(f"{fleet.central.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
                  if a["labels"]["alertname"] == PREEMPTION_ALERT]
        if alerts:
            break
        assert time.monotonic() < deadline, "the alert never became pending"
        time.sleep(0.5)
    assert [(instances[a["labels"]["instance"]], a["state"]) for a in alerts] == [(SLOW_NODE, "pending")]
    # The other nodes preempted less than the storm threshold, or not at all.
    per_node = {instances[r["metric"]["instance"]]: float(r["value"][1])
                for r in fleet.central.query(f"sum by (instance) (increase({C.PREEMPTIONS.sample}[{WINDOW}]))")}
    assert per_node.get(SLOW_NODE, 0) > 0


def _boards(tmp_path: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in write_dashboards(tmp_path) if p.suffix == ".json"}


def _selections(fleet: FleetRun) -> dict[str, list[tuple[str, dict[str, list[str]]]]]:
    """Per node, the template-variable selections that pick that node alone, as a user would in
    Grafana: by its node; the slow node also by its model and engine instance (the agent target,
    a HOST:PORT whose dots Grafana escapes), which proves those two variables on every query
    without tripling the module's time."""
    return {name: [(f"node={name}", {"node": [name]})] + ([
        (f"model={MODEL}, instance={node.agent_instance}", {"model": [MODEL], "instance": [node.agent_instance]})]
        if name == SLOW_NODE else []) for name, node in fleet.nodes.items()}


def test_every_dashboard_query_has_data_for_each_node(fleet: FleetRun, tmp_path: Path) -> None:
    """Each query of each generated dashboard, its template variables substituted as Grafana does
    (grafana_emulation: each node selected alone, by node and by model + instance, the rest "All";
    then everything "All", the regex .*), answers from the central Prometheus for every node, except
    where that node's agent has none of the series the query reads (a node that never preempted has
    no preemption series): expected from each agent's own /metrics (query_coverage), not from
    Prometheus. The GPU-fed panels (no GPU here) are empty."""
    boards = _boards(tmp_path)
    assert kernels.UID in boards and fleet_board.UID in boards
    del boards[kernels.UID]  # fed by the flight recorder, off in the fleet (loopback_fleet.AGENT_SLO_E2E_S says why)
    gpu_fed = {(gpu.UID, title) for title in gpu.gpu_fed_titles()}
    wrong: dict[str, list[str]] = {}
    without_events: dict[str, set[str]] = {}
    any_node: dict[tuple[str, str, str], bool] = {}
    jobs = []
    for node, selections in _selections(fleet).items():
        exposition = httpx.get(f"http://{fleet.nodes[node].agent_instance}/metrics", timeout=60).text
        targets = query_coverage(boards, sample_names(exposition))
        assert len(targets) > 40
        for t in targets:
            expected = t.has_data and (t.dashboard, t.panel) not in gpu_fed
            key = (t.dashboard, t.panel, t.expr)
            any_node[key] = any_node.get(key, False) or expected
            for what, selection in selections:
                variables = boards[t.dashboard]["templating"]["list"]
                jobs.append((f"{t.dashboard} / {t.panel}: {t.expr[:90]}", f"{node} by {what}", expected,
                             substitute(t.expr, variables, selection, WINDOW)))
            if not t.has_data and (t.dashboard, t.panel) not in gpu_fed:
                without_events.setdefault(node, set()).add(t.panel)
    for (uid, panel, expr), expected in any_node.items():  # everything at "All"
        jobs.append((f"{uid} / {panel}: {expr[:90]}", "All", expected,
                     substitute(expr, boards[uid]["templating"]["list"], {}, WINDOW)))
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda job: bool(fleet.central.query(job[3])), jobs))
    for (what, who, expected, _), got in zip(jobs, answers):
        if got != expected:
            wrong.setdefault(what, []).append(f"{who} (data: {got})")
    assert len(jobs) > 5 * 40
    assert not wrong, f"queries whose data for a node is not what its agent holds: {json.dumps(wrong, indent=1)}"
    # Only the slow node preempted: the others lack exactly its preemption panel's series.
    assert SLOW_NODE not in without_events, without_events[SLOW_NODE]
    assert all(panels <= {"Preemptions and recomputation"} for panels in without_events.values()), without_events


def test_template_variables_list_the_fleets_labels(fleet: FleetRun, tmp_path: Path) -> None:
    """Every dashboard's variables, asked as Grafana asks them (label_values: Prometheus's label
    values API with the query's selector, the earlier variables substituted), list the fleet's nodes,
    models and agent targets as this test started them; none of its series has a namespace or pod
    (no Kubernetes here), so those list nothing and "All" (.*) stands. Chained: with one node
    chosen, the instance variable lists that node's agent alone."""
    expected = {"namespace": set(), "node": set(NODES), "pod": set(), "model": {MODEL},
                "instance": {n.agent_instance for n in fleet.nodes.values()}}
    picked = {"node": [SLOW_NODE]}
    for uid, board in _boards(tmp_path).items():
        variables = board["templating"]["list"]
        for var in variables:
            if var["name"] not in expected:
                continue
            selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]).groups()
            for selection, want in (({}, expected[var["name"]]),
                                    (picked, {fleet.nodes[SLOW_NODE].agent_instance} if var["name"] == "instance"
                                     else None)):
                if want is None:
                    continue
                got = httpx.get(f"{fleet.central.url}/api/v1/label/{label}/values", timeout=10,
                                params={"match[]": substitute(selector, variables, selection, WINDOW)}).json()
                assert set(got["data"]) == want, (uid, var["name"], selection, got)


def test_fleet_overview_lists_the_slow_node_first(fleet: FleetRun, tmp_path: Path) -> None:
    """The fleet overview's table as Grafana shows it (its queries over the run, its merge and sortBy
    transformations emulated): one row per node, the slow node first, its deviation above every other
    row's. How far above varies with the load beside the test (z 2.2 in one run at load 8, above 3.5
    in another: twelve requests' p99s on a shared 2-core CPU), so the order is asserted, not the cut;
    `infersight fleet` names the outlier with its cause (test_fleet_names_the_slow_node_and_its_cause)."""
    board = _boards(tmp_path)[fleet_board.UID]
    panel = next(p for p in board["panels"] if p["title"] == fleet_board.TABLE_TITLE)
    rows = table_rows(panel, fleet.central.query, lambda e: substitute(e, board["templating"]["list"], {}, WINDOW))
    assert sorted(r["node"] for r in rows) == sorted(NODES), rows
    assert {r["instance"] for r in rows} == {n.agent_instance for n in fleet.nodes.values()}
    assert rows[0]["node"] == SLOW_NODE, rows
    assert rows[0][fleet_board.DEVIATION] > max(r[fleet_board.DEVIATION] for r in rows[1:]), rows
    assert rows[0][fleet_board.DEVIATION] > 0 and all(r[fleet_board.DEVIATION] < Z_CUT for r in rows[1:]), rows
    assert rows[0]["Preemptions"] > 0 and all(r["Preemptions"] == 0 for r in rows[1:]), rows


def test_one_app_trace_spans_two_nodes_in_phoenix(fleet: FleetRun) -> None:
    if fleet.phoenix is None:
        require_service("Phoenix", str(fleet.fanout["missing"]))
    trace = fleet.fanout
    assert len(trace["answers"]) == 2  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    while True:  # Phoenix writes in the background
        spans = [s for s in phoenix_spans(fleet.phoenix) if s["context"]["trace_id"] == trace["trace_id"]]
        engine = [s for s in spans
                  if s["parent_id"] == trace["span_id"] and s["attributes"].get("infersight.request_id")]
        if len(engine) == 2:
            break
        assert time.monotonic() < deadline, f"engine spans missing in Phoenix: {[s['name'] for s in spans]}"
        time.sleep(0.5)
    assert "fan_out" in {s["name"] for s in spans}
    # Which node served each engine span: its request id is known to that node's agent alone.
    served = {}
    for span in engine:
        rid = span["attributes"]["infersight.request_id"]
        owners = [n.name for n in fleet.nodes.values()
                  if httpx.get(f"http://{n.agent_instance}/api/v1/requests/{rid}", timeout=10).status_code == 200]
        served[rid] = owners
    owners = sorted(o for names in served.values() for o in names)
    assert owners == sorted(trace["nodes"]), served  # type: ignore[arg-type]
    # Phoenix keeps span attributes but not the OTLP resource (its ingest reads only the project name
    # from it), so the resource each agent put on its spans is read where it is built: the agent's
    # target_info is the same Resource (tracing.identity).
    for name in trace["nodes"]:  # type: ignore[union-attr]
        exposition = httpx.get(f"http://{fleet.nodes[name].agent_instance}/metrics", timeout=30).text
        assert f'k8s_node_name="{name}"' in next(line for line in exposition.splitlines()
                                                 if line.startswith("target_info{"))


def _fleet_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """The command line in this process (a child would only import the package again)."""
    code = main(["fleet", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fleet_names_the_slow_node_and_its_cause(fleet: FleetRun, capsys: pytest.CaptureFixture) -> None:
    code, out, err = _fleet_cli(capsys, "--prometheus-url", fleet.central.url, "--since", WINDOW, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert sorted(r["node"] for r in report["table"]) == sorted(NODES)
    assert {r["model"] for r in report["table"]} == {"tiny-moe"}
    instances = {r["node"]: r["instance"] for r in report["table"]}
    assert instances == {n.name: n.agent_instance for n in fleet.nodes.values()}
    symptoms = {r["node"]: {k: v for k, v in r.items() if k.endswith(("_p50_s", "_p99_s"))} for r in report["table"]}
    assert [o["node"] for o in report["outliers"]] == [SLOW_NODE], (report["outliers"], symptoms)
    outlier = report["outliers"][0]
    assert outlier["cause"] == "preemption", outlier
    link = f"http://{fleet.nodes[SLOW_NODE].agent_instance}/api/v1/requests?slowest=20"
    assert outlier["slowest_requests"] == [link]
    slowest = httpx.get(link, timeout=10).json()["requests"]
    assert slowest and len(slowest) <= 20
    for fmt in ("text", "html"):
        code, out, err = _fleet_cli(capsys, "--prometheus-url", fleet.central.url, "--since", WINDOW, "--format", fmt)
        assert code == 0 and f"node {SLOW_NODE}" in out and link in out, err



def test_fleet_judges_each_node_at_the_buckets_its_agent_exposes(fleet: FleetRun) -> None:
    """The bounds the outlier judge read a node's quantiles at (fleet.outliers) are the `le` values that
    node's agent serves on /metrics, read here from the raw exposition text."""
    report = build_report(PrometheusAPI(fleet.central.url), FleetConfig(fleet.central.url, since=WINDOW))
    for spec, column in ((C.TTFT, "ttft_p50_s"), (C.ITL, "itl_p99_s"), (C.E2E, "e2e_p50_s")):
        for node in fleet.nodes.values():
            text = httpx.get(f"http://{node.agent_instance}/metrics", timeout=10).text
            exposed = {float(le) for le in re.findall(rf'^{spec.name}_bucket{{[^}}]*le="([^"]+)"', text, re.M)}
            mine = report.buckets[(report.buckets["node"] == node.name) & (report.buckets["column"] == column)]
            assert exposed and set(mine["le"]) == exposed, (node.name, column)
