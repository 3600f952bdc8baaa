"""The Kernels dashboard's roofline-position query names, for every share, the ceiling it was placed
against and the compute peak's source, per agent: checked by promtool's rule unit tests on series
as two agents would expose them (a CPU one against its measured ceiling, a GPU one against a
datasheet)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from testkit import needs_service

from infersight.dashboards.grafana.kernels import named_roof_fraction
from infersight.exporters import catalogue as C

PROMTOOL = "/usr/bin/promtool"
needs_promtool = needs_service("promtool", Path(PROMTOOL).exists(),
                               "no /usr/bin/promtool (Debian's prometheus package; `make services` installs it)")
#: (instance, category, fraction) and (instance, ceiling, source, peak FLOP/s) as the agents expose them.
FRACTIONS = [("cpu", "GEMM", 0.12), ("cpu", "attention-decode", 0.01), ("gpu", "GEMM", 0.5)]
PEAKS = [("cpu", "CPU AMD EPYC", "measured", 3.1e10), ("gpu", "NVIDIA H200", "datasheet", 9.89e14)]


def _series(name: str, labels: dict[str, str], value: float) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": f"{value} {value}"}


def _promtool_evaluates(tmp: Path, inputs: list[dict], expected: list[dict]) -> None:
    """promtool's unit test: the query over `inputs` gives exactly `expected` (labels, value)."""
    spec = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": inputs,
        "promql_expr_test": [{"expr": named_roof_fraction(), "eval_time": "1m", "exp_samples": expected}]}]}
    path = tmp / "roof.yml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    res = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
def test_each_share_carries_its_agents_ceiling_and_source(tmp_path: Path) -> None:
    inputs = [_series(C.KERNEL_ROOF_FRACTION.sample, {"job": "infersight", "instance": i, "category": c}, v)
              for i, c, v in FRACTIONS]
    inputs += [_series(C.KERNEL_PEAK_FLOPS.sample, {"job": "infersight", "instance": i, "ceiling": n, "source": s}, v)
               for i, n, s, v in PEAKS]
    ceiling_of = {i: (n, s) for i, n, s, _ in PEAKS}
    expected = [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in {
                    "job": "infersight", "instance": i, "category": c, "ceiling": ceiling_of[i][0],
                    "source": ceiling_of[i][1]}.items()) + "}", "value": v}
                for i, c, v in FRACTIONS]
    _promtool_evaluates(tmp_path, inputs, expected)


@needs_promtool
def test_a_share_without_a_known_ceiling_is_not_shown(tmp_path: Path) -> None:
    """An agent that exposes fractions but no peak (cannot happen today: the gauge needs a ceiling)
    shows nothing rather than a share of an unnamed roof."""
    inputs = [_series(C.KERNEL_ROOF_FRACTION.sample, {"job": "infersight", "instance": "x", "category": "GEMM"}, 0.2)]
    _promtool_evaluates(tmp_path, inputs, [])
