"""`python -m infersight analyze`: the documented JSON on every capture kind, and a one-line
message with exit code 2 (no traceback) for inputs it cannot analyse."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from infersight.cli import main

REPO = Path(__file__).resolve().parents[2]
OUR_TRACE = Path(__file__).resolve().parent / "data" / "kineto_tiny-moe.json.gz"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "infersight", "analyze", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def _check_report(report: dict[str, Any], source: str) -> None:
    assert report["source"] == source
    assert set(report["kernels"]) >= {"count", "total_ns"} and report["kernels"]["count"] >= 1
    assert report["categories"] and all(set(c) >= {"name", "total_ns", "share"} for c in report["categories"])
    assert sum(c["total_ns"] for c in report["categories"]) == report["gpu_activity"]["total_ns"]
    assert all(set(r) >= {"name", "count", "kernel_ns"} for r in report["ranges"])
    assert all(set(f) >= {"severity", "text", "action"} for f in report["findings"])


@pytest.mark.parametrize("name,source", [
    ("kineto_hta_param_alexnet_a100.json.gz", "kineto"), ("kineto_hta_param_torch_add_a100.json.gz", "kineto"),
    ("nsys_saxpy_mpi_cuda_a100.sqlite", "nsys"), ("ncu_cublaslt_details.log", "ncu"),
])
def test_public_fixtures(name: str, source: str, shared_fixture: Callable[[str], Path]) -> None:
    done = _run(str(shared_fixture(name)), "--format", "json")
    assert done.returncode == 0, done.stderr
    _check_report(json.loads(done.stdout), source)


def test_our_capture_json() -> None:
    done = _run(str(OUR_TRACE), "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    _check_report(report, "kineto")
    assert report["kernels"]["count"] == 4025 and report["roofline"] == []
    names = {r["name"] for r in report["ranges"]}
    assert {"step", "forward.decode", "sampling", "layer.3.moe.experts"} <= names
    assert any(f["text"].startswith("decode is launch-bound") for f in report["findings"])


def test_roofline_options_and_text_format(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    # In-process: --model imports the runtime (torch), which this test process has loaded anyway.
    monkeypatch.setenv("INFERSIGHT_CEILINGS", str(tmp_path / "no-measurements.json"))  # the datasheet's ceilings
    args = ["analyze", str(OUR_TRACE), "--model", "tiny-moe", "--batch", "16", "--context", "160"]
    assert main([*args, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["op_category"] for r in report["roofline"]} >= {"GEMM", "attention-decode"}
    assert {r["phase"] for r in report["roofline"]} == {"decode"}  # the capture has no prefill
    assert any(f["text"].startswith("decode attention reaches") for f in report["findings"])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "findings:" in out and "forward.decode" in out and "roofline vs NVIDIA H200" in out
    assert main(["analyze", str(OUR_TRACE), "--model", "tiny-moe"]) == 2  # shapes are required
    assert "--batch" in capsys.readouterr().err


H200_CAPTURE = Path(__file__).resolve().parent / "data" / "kineto_llama-1b-decode-eager-h200.json.gz"


def _roofline_said(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict[str, Any], str]:
    """(the JSON report's ceilings, the text report's roofline header) of the shipped H200 capture."""
    assert main(["analyze", str(H200_CAPTURE), "--format", "json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["roofline"] and {r["phase"] for r in report["roofline"]} == {"captured"}  # its shapes file
    assert main(["analyze", str(H200_CAPTURE), *flags]) == 0
    text = capsys.readouterr().out
    return report["ceilings"], text[text.index("roofline"):text.index("phase    category")]


def test_the_roofline_names_its_ceilings_source(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    from infersight.kernels.ceilings.ceiling_cache import CeilingMeasurement, torch_version, write_cache

    cache = tmp_path / "ceilings.json"
    monkeypatch.setenv("INFERSIGHT_CEILINGS", str(cache))
    # No measurement: the capture's device (its deviceProperties say NVIDIA H200) by its datasheet.
    ceilings, said = _roofline_said(capsys)
    assert ceilings["name"] == "NVIDIA H200" and ceilings["dtype"] == "bfloat16"  # the shapes file's 2-byte elements
    assert ceilings["tflops_source"]["kind"] == ceilings["gbps_source"]["kind"] == "datasheet"
    assert "datasheet: NVIDIA H200" in said and "4.8 TB/s" in said
    # Measured on an H200 (an entry as `bench ceilings` writes it): named with its host and time.
    m = CeilingMeasurement("NVIDIA H200", "bfloat16", torch_version() or "none", "gpu-host-7", "2026-12-02T08:00:00Z",
                           "CUDA events", 4250.0, 2 << 30, 760.0, 8192, 20)
    write_cache(m, cache)
    ceilings, said = _roofline_said(capsys)
    assert (ceilings["peak_gbps"], ceilings["peak_tflops"]) == (m.copy_gbps, m.gemm_tflops)
    assert ceilings["gbps_source"]["kind"] == "measured" and "measured: device-to-device copy" in said
    assert "gpu-host-7" in said and m.measured_at in said
    # Peaks given by hand win, labelled given.
    ceilings, said = _roofline_said(capsys, "--peak-tflops", "500", "--peak-gbps", "3000")
    assert (ceilings["peak_tflops"], ceilings["peak_gbps"]) == (500.0, 3000.0)
    assert "500 TFLOP/s, given: --peak-tflops" in said and "3,000 GB/s, given: --peak-gbps" in said
    # A device with no measurement and no datasheet: no roof, and the report says so.
    ceilings, said = _roofline_said(capsys, "--device-name", "NVIDIA L4")
    assert ceilings["known"] is False and "no compute or memory-bandwidth ceiling known for NVIDIA L4" in said


def test_prometheus_text_goes_to_the_gpu_analysis(shared_fixture: Callable[[str], Path]) -> None:
    done = _run(str(shared_fixture("dcgm_exporter_l4.prom")), "--format", "json")
    if importlib.util.find_spec("infersight.gpu.analyze") is None:
        assert done.returncode == 2 and "infersight.gpu.analyze" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["source"] == "prometheus"
    assert "Traceback" not in done.stderr


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    raw = gzip.decompress(OUR_TRACE.read_bytes())
    real = gzip.compress(raw[:200_000])
    files = {
        "truncated.json.gz": real[: len(real) // 2],
        "garbage.bin": bytes(range(256)) * 16,
        "empty_trace.json": b'{"traceEvents": []}',
        "words.txt": b"banana orbit velvet quantum seventeen\nlantern pickle harbor\n",
        "truncated.json": raw[:100_000],
        "zero.json": b"",
        "not_events.json": b'{"traceEvents": {"ph": "X"}}',
        "report.nsys-rep": b"\x00\x01binary",
    }
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    return {name: tmp / name for name in files}


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # In-process: an exception main() does not turn into a message would fail the test here just
    # as it would print a traceback from the command line.
    for name, path in _bad_inputs(tmp_path).items():
        assert main(["analyze", str(path), "--format", "json"]) == 2, name
        done = capsys.readouterr()
        lines = done.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("infersight: error: "), (name, done.err)
        assert str(path.name) in lines[0] and done.out == "", name
    assert main(["analyze", str(tmp_path / "missing.json")]) == 2
    capsys.readouterr()


def test_bad_input_from_the_command_line(tmp_path: Path) -> None:
    path = _bad_inputs(tmp_path)["truncated.json.gz"]
    done = _run(str(path), "--format", "json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "truncated or corrupt" in done.stderr
