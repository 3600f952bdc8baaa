"""promtool (Debian's prometheus package) for the rules tests: `check rules` on generated files and
`test rules` on unit-test files written here. Missing promtool is a failure under CI=true."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from testkit import needs_service

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = needs_service("promtool", Path(PROMTOOL).exists(),
                               "no /usr/bin/promtool (Debian's prometheus package; `make services` installs it)")


def check_rules(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "rules", *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_rules(tmp: Path, rule_files: list[Path], tests: list[dict], evaluation_interval: str = "1m",
               timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Write a unit-test file beside the rule files and run `promtool test rules` on it. Groups are
    evaluated in the order the files list them (recording groups first): promtool otherwise picks
    an order per run, and an alert reading a recorded series from a group evaluated after it sees
    the previous minute's value (as a real Prometheus may: its groups run independently)."""
    order = [g["name"] for p in rule_files for g in yaml.safe_load(p.read_text())["groups"]]
    path = tmp / "unit_tests.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(p) for p in rule_files],
                                    "evaluation_interval": evaluation_interval, "group_eval_order": order,
                                    "tests": tests}, sort_keys=False))
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=timeout_s)


def assert_passes(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"promtool failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"


# promtool's test function above is a helper, not a test.
test_rules.__test__ = False  # type: ignore[attr-defined]
