"""The CPU demo shows every layer: every metric name the shipped dashboards query (read from the
dashboards as generated: panel targets, annotations and template variables) has a sample in the
demo's final exposition (metrics.prom), except the names only GPU-fed panels query
(gpu.gpu_fed_titles: a CPU has no GPU to sample; benchmarks/energy_check.py checks them on a GPU
host). And the roofline's ceilings: on a machine with no ceilings cache the demo measures this CPU's
itself, the agent places its windows against exactly that measurement, and the demo says so.

Shares the one demo run of the dashboards tests (conftest.demo_run)."""
from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator

import pytest

from infersight.cli import main
from infersight.dashboards.grafana import build_dashboards, gpu, to_json
from infersight.demo_ceilings import CACHE_NAME
from infersight.demo_recorder import exposition_samples, recorder_rows
from infersight.exporters import catalogue as C
from infersight.kernels.ceilings.ceiling_cache import host_cpu_name, read_cache

NAME = re.compile(re.escape(C.P) + r"[a-zA-Z0-9_]+")


def _queries(board: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every query of a Grafana dashboard model: each panel's targets (rows'
    nested panels too), each annotation's and each template variable's."""
    for panel in board["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for target in p.get("targets", []):
                yield p["title"], target["expr"]
    for a in board.get("annotations", {}).get("list", []):
        if "expr" in a:
            yield f"annotation {a['name']}", a["expr"]
    for v in board.get("templating", {}).get("list", []):
        q = v.get("query")
        yield f"variable {v['name']}", q if isinstance(q, str) else (q or {}).get("query", "")


def queried_names() -> dict[str, set[tuple[str, str]]]:
    """Metric name -> the (dashboard uid, panel / annotation / variable) that query it."""
    where: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for uid, board in build_dashboards().items():
        for title, expr in _queries(json.loads(to_json(board))):
            for name in NAME.findall(expr):
                where[name].add((uid, title))
    return where


def test_every_queried_name_has_a_sample_at_the_end_of_the_cpu_demo(demo_run) -> None:
    queried = queried_names()
    present = exposition_samples((demo_run.out / "metrics.prom").read_text())
    gpu_fed = {(gpu.UID, title) for title in gpu.gpu_fed_titles()}
    gpu_only = {name for name, panels in queried.items() if panels <= gpu_fed}
    assert len(queried) > 60 and len(gpu_only) < len(queried) // 2  # the parse found the dashboards' queries
    missing = {name: sorted(panels) for name, panels in queried.items() if name not in present and name not in gpu_only}
    assert not missing, f"queried by the dashboards, never exposed by the CPU demo: {json.dumps(missing, indent=1)}"
    # The exemption stays true: a CPU run has none of the GPU-only names.
    assert not gpu_only & set(present), gpu_only & set(present)
    # The recorder ran and analysed windows (not only its zeroed counters).
    analysed = {labels["outcome"]: v for labels, v in present[C.RECORDER_WINDOWS.sample]}["analysed"]
    assert analysed >= 1


def test_the_demo_measures_this_cpus_ceilings_and_names_them(demo_run) -> None:
    """No ceilings cache (the fixture's $INFERSIGHT_CEILINGS names a missing file): the demo measured
    into its own cache, the user's stayed unwritten, and the agent's peaks are that measurement."""
    assert not demo_run.ceilings_cache.exists()
    measured = read_cache(demo_run.out / CACHE_NAME)
    assert [m.device for m in measured] == [host_cpu_name()]
    m = measured[0]
    present = exposition_samples((demo_run.out / "metrics.prom").read_text())
    flops = present[C.KERNEL_PEAK_FLOPS.sample]
    gbps = present[C.KERNEL_PEAK_BYTES.sample]
    assert [labels for labels, _ in flops] == [{"ceiling": m.device, "source": "measured"}]
    assert [labels for labels, _ in gbps] == [{"ceiling": m.device, "source": "measured"}]
    assert abs(flops[0][1] - m.gemm_tflops * 1e12) <= 1e-9 * flops[0][1]
    assert abs(gbps[0][1] - m.copy_gbps * 1e9) <= 1e-9 * gbps[0][1]
    fractions = present[C.KERNEL_ROOF_FRACTION.sample]
    assert fractions and all(v > 0 for _, v in fractions)
    # Said where people read it: the ceilings line (rich wraps it: compared without whitespace), and
    # the summary's roofline row, each share against the ceiling named with its sources.
    assert _squeezed(f"roofline ceilings: {m.device}") in _squeezed(demo_run.stdout)
    assert _squeezed("measured now by the demo") in _squeezed(demo_run.stdout)
    row = dict(recorder_rows((demo_run.out / "metrics.prom").read_text()))["roofline (sampled)"]
    assert row.endswith(f"of the roof of {m.device} (compute measured, bandwidth measured)"), row
    assert row.count("%") == len(fractions)


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("budget", ["0", "0.5", "-0.1"])
def test_a_budget_the_recorder_cannot_keep_is_one_line_and_exit_2(budget: str, capsys) -> None:
    """Refused before the engine or the agent starts: a message, not a traceback from the agent's log."""
    assert main(["demo", "--recorder-budget", budget, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("infersight: error: --recorder-budget must be in (0, 0.5)") and "Traceback" not in err
