"""`infersight compare`: run folders as the demo writes them (summary.json, requests.parquet through
the agent's ParquetSink), a summary file alone, the text / JSON / HTML outputs, and bad input."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from infersight.cli import main
from infersight.correlate.requests import PARTS, REQUEST_FIELDS
from infersight.dashboards.report.compare_inputs import load_compared_run
from infersight.exporters.parquet import ParquetSink

N = 120


def _write_run(folder: Path, seed: int, ttft_shift_s: float, with_rows: bool = True) -> list[float]:
    """A run folder with N request rows (TTFT ~ 30 ms + shift) and a summary; returns the TTFTs."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    ttfts = (rng.lognormal(-3.5, 0.1, N) + ttft_shift_s).tolist()
    rows = []
    for i, ttft in enumerate(ttfts):
        row: dict[str, object] = {name: None for name in REQUEST_FIELDS}
        row.update(request_id=i, task="chat", queue_s=0.001, prefill_s=ttft - 0.001, preemption_stall_s=0.0,
                   decode_s=0.2, network_s=0.0, ttft_s=ttft, itl_mean_s=0.01, slow_cause="")
        row["e2e_s"] = sum(row[p] for p in PARTS)  # type: ignore[misc]
        rows.append(row)
    if with_rows:
        sink = ParquetSink(folder / "requests.parquet")
        sink.write(rows)
        sink.close()
    summary = {"requests": N, "ttft_seconds": {"p50": float(np.quantile(ttfts, 0.5)), "p99": None},
               "kv": {"preemptions": seed, "evictions": 0, "offloads": 0, "reloads": 0, "recomputed_tokens": 0},
               "prefix_cache": {"token_hit_rate": 0.1, "request_hit_rate": 0.2},
               "moe": {"layers": [], "expert_tokens": [[3, 1], [2, 2]]},
               "spec": {"by_task": {"chat": {"accept_rate": 0.5, "mean_accepted_length": 2.0}}}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return ttfts


@pytest.fixture()
def two_runs(tmp_path: Path) -> tuple[Path, Path, list[float], list[float]]:
    ttft_a = _write_run(tmp_path / "base", 1, 0.0)
    ttft_b = _write_run(tmp_path / "slow", 2, 0.010)
    return tmp_path / "base", tmp_path / "slow", ttft_a, ttft_b


def test_json_output(two_runs, capsys) -> None:
    a, b, ttft_a, ttft_b = two_runs
    assert main(["compare", str(a), str(b), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["a"]["name"], doc["b"]["name"], doc["a"]["rows"]) == ("base", "slow", N)
    p50 = doc["latency"]["ttft_s"]["p50"]
    assert p50["b_minus_a"] == pytest.approx(np.quantile(ttft_b, 0.5) - np.quantile(ttft_a, 0.5))
    assert p50["interval_95"][0] > 0 and p50["verdict"] == "higher in b"  # 10 ms against a ~3 ms spread
    assert doc["latency"]["itl_mean_s"]["p50"]["verdict"] == "inside the noise"  # 10 ms in every row of both
    assert doc["kv"]["preemptions"]["b_minus_a"] == 1
    assert doc["expert_load"]["layers"][0]["max_over_mean_a"] == pytest.approx(3 / 2)
    assert "measured" in doc["basis"]["latency"] and "modelled" in doc["basis"]["speculation"]


def test_text_and_html_outputs(two_runs, tmp_path: Path, capsys) -> None:
    a, b, ttft_a, ttft_b = two_runs
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    diff_ms = (np.quantile(ttft_b, 0.5) - np.quantile(ttft_a, 0.5)) * 1e3
    assert re.search(rf"ttft_s p50 .*{re.escape(f'{diff_ms:+.2f}')} ms .*higher in b", text)
    assert re.search(r"itl_mean_s p50 .*inside the noise", text)
    assert "basis:" in text
    page = tmp_path / "compare.html"
    assert main(["compare", str(a), str(b), "--format", "html", "--out", str(page)]) == 0
    assert capsys.readouterr().out.strip() == str(page)
    html = page.read_text()
    assert 'id="compare-latency"' in html and "higher in b" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_a_summary_file_alone_and_a_folder_without_rows(tmp_path: Path, capsys) -> None:
    _write_run(tmp_path / "a", 1, 0.0)
    _write_run(tmp_path / "b", 2, 0.0, with_rows=False)
    run_b = load_compared_run(tmp_path / "b")
    assert run_b.requests is None
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b" / "summary.json"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["b"] == {"name": "summary.json", "requests": N, "rows": None}
    assert doc["latency"]["ttft_s"]["p50"]["interval_95"] is None
    assert doc["latency"]["ttft_s"]["p99"] == {"absent": "absent in summary.json"}
    assert doc["phase_shares"] == {"absent": "absent in summary.json"}


def test_folders_of_one_name_are_called_by_their_paths(tmp_path: Path, capsys) -> None:
    _write_run(tmp_path / "x" / "out", 1, 0.0)
    _write_run(tmp_path / "y" / "out", 2, 0.0)
    assert main(["compare", str(tmp_path / "x" / "out"), str(tmp_path / "y" / "out"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"]["name"] == str(tmp_path / "x" / "out") and doc["b"]["name"] == str(tmp_path / "y" / "out")


@pytest.mark.parametrize("what", ["missing", "empty", "bad-json", "not-summary", "bad-parquet"])
def test_bad_input_is_one_line_and_exit_2(two_runs, tmp_path: Path, capsys, what: str) -> None:
    a = two_runs[0]
    bad = tmp_path / what
    if what != "missing":
        bad.mkdir()
    if what == "bad-json":
        (bad / "summary.json").write_text("{")
    elif what == "not-summary":
        (bad / "summary.json").write_text("[1, 2]")
    elif what == "bad-parquet":
        (bad / "summary.json").write_text('{"requests": 1}')
        (bad / "requests.parquet").write_bytes(b"not parquet")
    assert main(["compare", str(a), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("infersight: error: ") and str(bad) in err


def test_a_real_run_folder_against_itself(run_dir: Path, capsys) -> None:
    """The files an agent with --parquet-dir and the summary wrote (the report's run): every section
    the reference engine reports is present, and a run against itself differs by nothing."""
    assert main(["compare", str(run_dir), str(run_dir), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = len(load_compared_run(run_dir).requests)  # type: ignore[arg-type]
    assert doc["a"]["rows"] == doc["b"]["rows"] == rows > 0
    for metric in doc["latency"].values():
        for d in metric.values():
            assert d["b_minus_a"] == 0.0 and d["verdict"] == "inside the noise"
    for section in ("phase_shares", "prefix_cache", "kv", "expert_load", "speculation"):
        assert "absent" not in doc[section], section
    assert {layer["b_minus_a"] for layer in doc["expert_load"]["layers"]} == {0.0}
