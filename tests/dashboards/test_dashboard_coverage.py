"""query_coverage (tests/dashboards/query_coverage.py) on a hand-written exposition: which queries have their series."""
from __future__ import annotations

import json

from infersight.dashboards.grafana import build_dashboards, gpu, to_json
from infersight.exporters import catalogue as C
from query_coverage import query_coverage, sample_names

EXPOSITION = f"""# TYPE {C.ENERGY.name} counter
{C.ENERGY.name}_total{{task="chat"}} 12.5
# TYPE {C.GENERATION_TOKENS.name} counter
{C.GENERATION_TOKENS.name}_total{{task="chat"}} 40
# TYPE {C.GPU_POWER.name} gauge
{C.GPU_POWER.name}{{gpu="0",uuid="GPU-x"}} 300
"""


def test_queries_have_data_when_every_named_series_is_present() -> None:
    present = sample_names(EXPOSITION)
    assert present == {C.ENERGY.sample, C.GENERATION_TOKENS.sample, C.GPU_POWER.sample}
    boards = {"b": {"panels": [{"title": "p", "targets": [
        {"expr": C.ENERGY.views["per_output_token"]},  # energy and tokens: both there
        {"expr": C.ENERGY_IDLE.rate()},  # absent
        {"expr": f"sum({C.STEPS.sample}) or sum({C.GPU_POWER.sample})"},  # one alternative suffices
        {"expr": f"sum({C.STEPS.sample}) or sum({C.ENERGY_IDLE.sample})"}]}]}}
    got = [(c.has_data, c.missing) for c in query_coverage(boards, present)]
    assert got == [(True, ()), (False, (C.ENERGY_IDLE.sample,)), (True, ()), (False, (C.STEPS.sample,))]


def test_every_gpu_fed_panel_is_on_the_gpu_dashboard() -> None:
    boards = {uid: json.loads(to_json(b)) for uid, b in build_dashboards().items()}
    titles = {c.panel for c in query_coverage(boards, set()) if c.dashboard == gpu.UID}
    assert gpu.gpu_fed_titles() <= titles
