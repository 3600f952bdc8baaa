"""`infersight rules` from the command line: it writes the five files, and a bad flag is a one-line
error with a non-zero exit and no traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infersight.cli import main


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infersight", "rules", *args], capture_output=True, text=True,
                          timeout=120)


def test_writes_the_rule_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "--out", str(tmp_path), "--slo-ttft-s", "1", "--slo-target", "0.995",
                 "--namespace", "llm"]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in printed) == sorted(p.name for p in tmp_path.iterdir()) == [
        "infersight-alerts.rules.yml", "infersight-gpu.rules.yml", "infersight-prometheusrule.yaml",
        "infersight-recording.rules.yml", "infersight-slo.rules.yml"]
    resource = yaml.safe_load((tmp_path / "infersight-prometheusrule.yaml").read_text())
    assert resource["metadata"]["namespace"] == "llm"
    # 1 s and 99.5% reached the TTFT rules (the agent writes the bound 1.0 as "1.0")
    slo = (tmp_path / "infersight-slo.rules.yml").read_text()
    assert r'time_to_first_token_seconds_bucket{le=~"1|1\\.0"}' in slo and "/ 0.005 > 14.4" in slo


@pytest.mark.parametrize("args, says", [
    (["--slo-ttft-s", "0.3"], "not a bucket bound"),
    (["--slo-itl-s", "abc"], "--slo-itl-s"),
    (["--slo-e2e-s", "-5"], "--slo-e2e-s"),
    (["--slo-target", "1.5"], "--slo-target"),
    (["--slo-target", "nan"], "--slo-target"),
    (["--agent-selector", "job="], "--agent-selector"),
    (["--bogus"], "unrecognized arguments"),
    ([], "--out"),
])
def test_bad_flags_are_one_line_errors(tmp_path: Path, args: list[str], says: str) -> None:
    out = [] if args == [] else ["--out", str(tmp_path / "out")]
    res = _cli(*out, *args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("")
    res = _cli("--out", str(target))
    assert res.returncode == 2 and "not a directory" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
