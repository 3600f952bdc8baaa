"""The agent's /metrics after a real (tiny) workload: promtool-clean, OpenMetrics exemplars that carry
the engine's trace ids, the vLLM-compatible view (through the CLI's --vllm-compat), and every
family matching its catalogue entry."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from infersight.agent.config import AgentConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.service import Agent
from infersight.agent.state import AgentState
from infersight.exporters import catalogue as C
from infersight.exporters.prometheus import build_registry

# The workload helpers live beside the agent tests (no packages under tests/).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_workload import free_port, make_engine, run_workload, unique_ring  # noqa: E402
from testkit import needs_service  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = needs_service("promtool", Path(PROMTOOL).exists(),
                               "no /usr/bin/promtool (Debian's prometheus package; `make services` installs it)")
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
MODEL_NAME = "tiny-test-model"
#: The catalogue's vllm_name entries the compat view does not serve, and why.
VLLM_NOT_SERVED: dict[str, str] = {}  # every catalogue vllm_name is served by the compat view
VLLM_EXTRA_LABELS = {"vllm:request_success": {"finished_reason"}}  # vLLM's own label set for it


def promtool_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def inproc():
    """Workload with an in-process agent (defaults: no vLLM names); its /metrics in both formats."""
    ring = unique_ring("expo")
    engine, probe = make_engine(ring)
    # min_requests_for_p99=2: with six requests the slow-request attribution has something to do.
    agent = Agent(AgentConfig(rings=[ring], port=0, slow=SlowRequestConfig(min_requests_for_p99=2)))
    agent.start_http()
    try:
        work = run_workload(engine, agent.poll_once)
        agent.poll_once()
        url = f"http://127.0.0.1:{agent.port}/metrics"
        text = httpx.get(url, timeout=10)
        om = httpx.get(url, headers={"Accept": OPENMETRICS}, timeout=10)
        assert text.status_code == om.status_code == 200
        yield work, agent, text, om
    finally:
        agent.close()
        probe.close()


@pytest.fixture(scope="module")
def compat(tmp_path_factory):
    """The same workload with the agent as a separate process: `infersight agent --vllm-compat`.
    Returns (workload, /metrics text, /api/v1/summary, the agent's exit code after SIGTERM)."""
    log_path = tmp_path_factory.mktemp("agent") / "agent.log"
    ring = unique_ring("compat")
    engine, probe = make_engine(ring)  # the ring exists before the agent starts
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen",
                                 f"127.0.0.1:{port}", "--poll-interval", "0.05", "--vllm-compat",
                                 "--model-name", MODEL_NAME], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the agent exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{base}/health", timeout=1).json()["rings"] == [ring]:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the agent did not attach within 30 s:\n{log_path.read_text()}")
            time.sleep(0.1)
        work = run_workload(engine)
        deadline = time.monotonic() + 30
        while (summary := httpx.get(f"{base}/api/v1/summary", timeout=5).json())["requests"] < len(work.prompts):
            assert time.monotonic() < deadline, summary
            time.sleep(0.1)
        text = httpx.get(f"{base}/metrics", timeout=10).text
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        yield work, text, summary, rc, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        probe.close()


def _families(text: str) -> dict:
    return {f.name: f for f in parse_text(text)}


def _total(fam, suffix: str = "", **labels: str) -> float:
    return sum(s.value for s in fam.samples if s.name == fam.name + suffix
               and all(s.labels.get(k) == v for k, v in labels.items()))


# -- promtool ---------------------------------------------------------------------------------------
@needs_promtool
def test_promtool_finds_nothing(inproc) -> None:
    _, _, text, _ = inproc
    assert "infersight_requests_total" in text.text
    res = promtool_check(text.text)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


@needs_promtool
def test_promtool_over_the_expert_cap(inproc) -> None:
    """The other MoE shape: layers x experts over max_expert_series (layer="all" + hot pairs)."""
    _, agent, _, _ = inproc
    state = AgentState(AgentConfig(rings=["unused"], exposition=ExpositionConfig(max_expert_series=4, top_hot_pairs=3)))
    state.expert_tokens = agent.state.expert_tokens.copy()
    text = generate_latest(build_registry(state)).decode()
    res = promtool_check(text)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    fams = _families(text)
    m = agent.state.expert_tokens
    assert m.shape == (2, 4) and m.size > 4
    summed = {s.labels["expert"]: s.value for s in fams[C.EXPERT_TOKENS.name].samples}
    assert all(s.labels["layer"] == "all" for s in fams[C.EXPERT_TOKENS.name].samples)
    assert summed == {str(e): float(m[:, e].sum()) for e in range(m.shape[1])}
    hot = sorted((s.value for s in fams[C.HOT_EXPERT_TOKENS.name].samples), reverse=True)
    assert hot == sorted(m.ravel().astype(float), reverse=True)[:3]
    for s in fams[C.HOT_EXPERT_TOKENS.name].samples:
        assert set(s.labels) == set(C.HOT_EXPERT_TOKENS.exposed_labels)
        assert m[int(s.labels["layer"]), int(s.labels["expert"])] == s.value


def test_hot_pairs_under_the_expert_cap_too(inproc) -> None:
    """Under the cap every pair has its own series, and the hottest pairs their gauge as well (the
    dashboards' hottest-pairs panel reads only the gauge)."""
    _, agent, _, _ = inproc
    state = AgentState(AgentConfig(rings=["unused"], exposition=ExpositionConfig(top_hot_pairs=3)))
    state.expert_tokens = agent.state.expert_tokens.copy()
    fams = _families(generate_latest(build_registry(state)).decode())
    m = state.expert_tokens
    assert {s.labels["layer"] for s in fams[C.EXPERT_TOKENS.name].samples} == {str(i) for i in range(m.shape[0])}
    hot = {(int(s.labels["layer"]), int(s.labels["expert"])): s.value for s in fams[C.HOT_EXPERT_TOKENS.name].samples}
    assert sorted(hot.values(), reverse=True) == sorted(m.ravel().astype(float), reverse=True)[:3]
    assert all(m[layer, expert] == v for (layer, expert), v in hot.items())


@needs_promtool
def test_promtool_on_vllm_names_flags_only_their_colons(compat) -> None:
    """vLLM's own names contain ':', which promlint reserves for recording rules: that is the one
    complaint allowed, and only for the vllm: aliases."""
    _, text, *_ = compat
    res = promtool_check(text)
    lines = res.stdout.splitlines() + res.stderr.splitlines()
    assert lines
    for line in lines:
        assert line.startswith("vllm:") and line.endswith("metric names should not contain ':'"), line


# -- OpenMetrics and exemplars -------------------------------------------------------------------------
def test_openmetrics_exemplars_are_the_engines_trace_ids(inproc) -> None:
    work, agent, text, om = inproc
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    assert "trace_id" not in text.text  # the classic text format has no exemplars
    rows = {r["trace_id"]: r for r in agent.state.finished}
    fams = {f.name: f for f in parse_openmetrics(om.text)}  # the reference parser: strict about the format
    for spec, column in ((C.TTFT, "ttft_s"), (C.E2E, "e2e_s")):
        seen = []
        previous_le: dict[tuple, float] = {}
        for s in fams[spec.name].samples:
            if s.name != spec.name + "_bucket":
                continue
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            lo, hi = previous_le.get(key, float("-inf")), float(s.labels["le"])
            previous_le[key] = hi
            if s.exemplar is None:
                continue
            trace = s.exemplar.labels["trace_id"]
            assert set(s.exemplar.labels) == {"trace_id"}
            assert len(trace) == 32 and int(trace, 16) > 0
            assert trace in work.trace_ids
            assert lo < s.exemplar.value <= hi  # in its own bucket
            assert s.exemplar.value == pytest.approx(rows[trace][column], abs=1e-9)
            assert rows[trace]["task"] == s.labels["task"]
            seen.append(trace)
        assert seen, spec.name
    # Only request latencies carry exemplars.
    for name, fam in fams.items():
        if name not in (C.TTFT.name, C.E2E.name):
            assert all(s.exemplar is None for s in fam.samples), name


def test_openmetrics_and_text_agree(inproc) -> None:
    _, _, text, om = inproc
    plain = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in parse_text(text.text) for s in f.samples}
    openm = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in parse_openmetrics(om.text)
             for s in f.samples}
    assert plain == openm


# -- the vLLM-compatible view ----------------------------------------------------------------------------
def test_vllm_compat_names_and_counts(compat) -> None:
    work, text, summary, rc, log = compat
    assert rc == 0, log.read_text()  # SIGTERM: a clean stop
    fams = _families(text)
    n = len(work.prompts)
    assert summary["requests"] == n
    for spec in (C.TTFT, C.E2E, C.ITL):
        mine, theirs = fams[spec.name], fams[spec.vllm_name]
        assert theirs.type == "histogram"
        assert {s.labels["model_name"] for s in theirs.samples} == {MODEL_NAME}
        assert all(set(s.labels) - {"le"} == {"model_name"} for s in theirs.samples)
        assert _total(theirs, "_count") == _total(mine, "_count") > 0
        assert _total(theirs, "_sum") == pytest.approx(_total(mine, "_sum"))
        les = sorted({s.labels["le"] for s in mine.samples if s.name.endswith("_bucket")})
        for le in les:  # the merged buckets are the per-task buckets summed
            assert _total(theirs, "_bucket", le=le) == _total(mine, "_bucket", le=le)
    assert _total(fams["vllm:e2e_request_latency_seconds"], "_count") == n
    for spec in (C.PROMPT_TOKENS, C.GENERATION_TOKENS, C.PREEMPTIONS, C.PREFIX_QUERIED, C.PREFIX_HIT, C.SPEC_DRAFT,
                 C.SPEC_ACCEPTED):
        theirs = fams[spec.vllm_name]
        assert theirs.type == "counter"
        assert [s.labels for s in theirs.samples if s.name.endswith("_total")] == [{"model_name": MODEL_NAME}]
        assert _total(theirs, "_total") == _total(fams[spec.name], "_total"), spec.vllm_name
    assert _total(fams["vllm:prompt_tokens"], "_total") == work.prompt_tokens()
    for spec in (C.REQUESTS_RUNNING, C.REQUESTS_WAITING, C.KV_USAGE):
        theirs = fams[spec.vllm_name]
        assert theirs.type == "gauge" and [s.labels for s in theirs.samples] == [{"model_name": MODEL_NAME}]
        assert theirs.samples[0].value == fams[spec.name].samples[0].value


def test_every_family_is_in_the_catalogue(compat) -> None:
    _, text, *_ = compat
    specs = {**C.by_name(), **{spec.name: spec for spec in C.AGENT_SERVICE_METRICS + C.IDENTITY_METRICS}}  # (own collectors)
    aliases = {spec.vllm_name: spec for spec in C.CATALOGUE if spec.vllm_name}
    served_aliases = set()
    for name, fam in _families(text).items():
        if name.startswith("vllm:"):
            spec = aliases.get(name)
            assert spec is not None, f"{name} is not a catalogue vllm_name"
            served_aliases.add(name)
            want = {"model_name"} | VLLM_EXTRA_LABELS.get(name, set())
        else:
            spec = specs.get(name)
            assert spec is not None, f"{name} is not in the catalogue"
            assert fam.documentation == spec.help, name
            want = set(spec.exposed_labels)
        if spec is C.TARGET_INFO:  # an info family (a gauge in this format); its labels are the resource's
            assert fam.type == "gauge" and [s.value for s in fam.samples] == [1.0]
            continue
        assert fam.type == spec.kind, name
        for s in fam.samples:
            assert set(s.labels) - {"le"} == want, (name, s)
    assert set(aliases) - served_aliases == set(VLLM_NOT_SERVED)


def test_every_catalogue_entry_is_exposed_with_its_labels(inproc) -> None:
    """The other direction, on the default exposition: each entry's family is there (some without
    samples: a CPU run reads no GPU energy counter)."""
    _, _, text, _ = inproc
    fams = _families(text.text)
    without_samples = {C.ENERGY.name, C.ENERGY_IDLE.name}
    without_samples.add(C.PROBE_REJECTED.name)  # a clean run refuses no record (tests/agent/test_record_limits.py)
    # No GPU here: the none collector yields no GPU families except its (zero) error counter.
    absent = {spec.name for spec in C.GPU_METRICS if spec is not C.GPU_COLLECTOR_ERRORS}
    # The flight recorder is off here: its counters are empty families, its gauges absent (with it on,
    # tests/agent/test_prometheus_integration.py checks every one of them).
    without_samples |= {spec.name for spec in C.KERNEL_METRICS if spec.kind == "counter"}
    absent |= {spec.name for spec in C.KERNEL_METRICS if spec.kind == "gauge"}
    for spec in C.CATALOGUE:
        if spec.name in absent:
            assert spec.name not in fams
            continue
        fam = fams[spec.name]
        assert fam.type == spec.kind
        if spec.name in without_samples:
            assert not fam.samples
            continue
        assert fam.samples, spec.name
        assert {frozenset(set(s.labels) - {"le"}) for s in fam.samples} == {frozenset(spec.exposed_labels)}, spec.name

