"""The SLO burn-rate alerts under `promtool test rules`, on histograms built from the catalogue:
each of the four window pairs fires on a burn sized for it, the others stay silent, a healthy
service beside it stays silent, and an alert is not firing before its `for` has passed.

Every scenario is per minute: N=100 observations, a share of them beyond the objective (at the
next bucket bound above it), the rest exactly at it (an inclusive bound: within). Series start
at 0, so a window longer than the data is a ratio of the data (no extrapolation either side).
Objective 99% (budget 1%): burn = error ratio / 0.01. The expected alerts and values below are
worked out by hand in each test's comments."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from prometheus_client.utils import floatToGoString

from infersight.exporters import catalogue as C
from infersight.exporters.rules import RulesConfig, write_rules
from rules_annotations import expected, find_alert, load_alerts
from rules_promtool import assert_passes, needs_promtool, test_rules
from rules_series import histogram_series

pytestmark = needs_promtool

N = 100
CONFIG = RulesConfig(slo_ttft_s=0.5, slo_itl_s=0.04, slo_e2e_s=10.0, slo_target=0.99)
#: (spec, objective, the next bucket bound above it, alert name) for the three objectives.
OBJECTIVES = [(C.TTFT, 0.5, 0.75, "InfersightTimeToFirstTokenBudgetBurn"),
              (C.ITL, 0.04, 0.06, "InfersightInterTokenLatencyBudgetBurn"),
              (C.E2E, 10.0, 20.0, "InfersightEndToEndLatencyBudgetBurn")]
SICK = {"namespace": "llm", "job": "infersight", "instance": "10.0.0.7:9464", "pod": "vllm-0", "task": "chat"}
HEALTHY = {**SICK, "job": "chat/infersight", "pod": "vllm-9", "instance": "10.0.0.9:9464"}
#: How bounds are spelled: as prometheus_client writes them ("10.0"), and as Prometheus 3 stores
#: classic-histogram bounds after normalising them ("10").
SPELLINGS: dict[str, Callable[[float], str]] = {"client": floatToGoString, "normalised": lambda b: format(b, "g")}


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("slo_rules")
    write_rules(out, CONFIG)
    return out / "infersight-slo.rules.yml"


def _inputs(phases: list[tuple[int, float, float]], le_text: Callable[[float], str]) -> list[dict]:
    """Every objective's histogram for the sick service, and an always-healthy service beside it."""
    minutes = sum(m for m, _, _ in phases)
    out = []
    for spec, objective, beyond, _ in OBJECTIVES:
        out += histogram_series(spec, SICK, phases, objective, beyond, le_text)
        out += histogram_series(spec, HEALTHY, [(minutes, N, 0)], objective, beyond, le_text)
    return out


def _case(rule_file: Path, phases: list[tuple[int, float, float]], le_text: Callable[[float], str],
          checks: list[tuple[int, dict[str, float]]]) -> list[dict]:
    """checks: (eval minute, {long_window: burn value}) -- the pairs firing then, for every objective."""
    alerts = load_alerts(rule_file)
    service = {"namespace": SICK["namespace"], "job": SICK["job"]}
    tests = []
    for minute, firing in checks:
        for _, _, _, name in OBJECTIVES:
            exp = [expected(find_alert(alerts, name, long_window=w), service, burn) for w, burn in firing.items()]
            tests.append({"eval_time": f"{minute}m", "alertname": name, "exp_alerts": exp})
    return [{"interval": "1m", "input_series": _inputs(phases, le_text), "alert_rule_test": tests}]


#: The day-long scenarios are evaluated every 5 minutes (the series stay per minute): a fifth of the
#: work, and the `for` arithmetic below is done on that grid.
COARSE = "5m"


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_fast_burn_pages_within_minutes(rule_file: Path, tmp_path: Path, spelling: str) -> None:
    # 400 healthy minutes, then every observation beyond the objective. After k bad minutes the
    # 1h error ratio is k/60 (burn 100k/60) and the 5m one is 1 (burn 100): both over 14.4 from
    # k=9 (burn 15), so pending at 409m and firing from 411m ("for: 2m"). At 412m: burn 20.
    # 6h: 12/360 -> 3.3 < 6. 1d (all 412 minutes): 12/412 -> 2.91 < 3. 3d: 2.91 > 1 (and 6h 3.3
    # > 1) since k=5, but its "for: 3h" has not passed. At 408m (burn 13.3) and 410m (pending)
    # nothing fires.
    phases = [(400, N, 0), (12, 0, N)]
    checks = [(408, {}), (410, {}), (412, {"1h": 20.0})]
    assert_passes(test_rules(tmp_path, [rule_file], _case(rule_file, phases, SPELLINGS[spelling], checks)))


def test_six_hour_burn_pages(rule_file: Path, tmp_path: Path) -> None:
    # 1200 healthy minutes, then 10% beyond (burn 10). 1h: 10 < 14.4. 6h after k minutes:
    # 0.1k/360 > 0.06 from k=217: on the 5-minute grid pending at k=220, firing from k=235
    # ("for: 15m"); at k=240 (1440m) burn
    # 0.1*240/360/0.01 = 6.667, and the 30m window burns 10 > 6. 1d (all 1440 minutes):
    # 24/1440 = 1.67 < 3. 3d: 1.67 > 1 since k=135 on the grid (0.1k/(1200+k) > 0.01) but
    # "for: 3h" needs k >= 315. At k=230 the 6h pair is pending only.
    phases = [(1200, N, 0), (240, 0.9 * N, 0.1 * N)]
    checks = [(1430, {}), (1440, {"6h": 0.1 * 240 / 360 / 0.01})]
    assert_passes(test_rules(tmp_path, [rule_file], _case(rule_file, phases, floatToGoString, checks), COARSE))


def test_slow_burn_opens_tickets(rule_file: Path, tmp_path: Path) -> None:
    # 1440 healthy minutes, then 5% beyond (burn 5): under 14.4 (1h) and 6 (6h), so no page.
    # 1d after k minutes: 0.05k/1440 > 0.03 from k=865 (on the 5-minute grid), firing from k=925
    # ("for: 1h"); at k=960 (2400m) burn 0.05*960/1440/0.01 = 3.333, the 2h window 5 > 3. 3d (all
    # 2400 minutes): 0.05k/(1440+k) > 0.01 from k=365 on the grid, firing from k=545 ("for: 3h");
    # at k=960 burn
    # 0.05*960/2400/0.01 = 2, the 6h window 5 > 1.
    phases = [(1440, N, 0), (960, 0.95 * N, 0.05 * N)]
    checks = [(2400, {"1d": 0.05 * 960 / 1440 / 0.01, "3d": 0.05 * 960 / 2400 / 0.01})]
    assert_passes(test_rules(tmp_path, [rule_file], _case(rule_file, phases, floatToGoString, checks), COARSE))


def test_no_traffic_is_no_burn(rule_file: Path, tmp_path: Path) -> None:
    # Traffic stops: a window without traffic has the ratio 0/0 (NaN, compares false): nothing fires, even
    # after a burn that paged: 100% beyond for 30 minutes (1h pair firing at 625m with burn
    # 25/60/0.01 = 41.67; pending from 610m on the 5-minute grid, firing from 615m), then no
    # traffic. At 1030m the 1d and 3d windows still hold the burn (30/630: burn 4.76, over 3 and
    # 1) but their short windows (2h, 6h: from 670m) hold no traffic: silent.
    phases = [(600, N, 0), (30, 0, N), (400, 0, 0)]
    checks = [(625, {"1h": 25 / 60 / 0.01}), (1030, {})]
    assert_passes(test_rules(tmp_path, [rule_file], _case(rule_file, phases, floatToGoString, checks), COARSE))
