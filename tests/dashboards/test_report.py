"""`infersight report`: the HTML file from a real run directory, its figures and notes, the GPU and
kernel figures from synthetic inputs, bad input, and the report written at the end of the demo."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infersight.cli import main
from infersight.dashboards.report import REPORT_NAME, write_report

#: Figures a CPU run of the demo workload draws (img ids), and those it skips with a note.
DRAWN = ("fig-ttft-decomposition", "fig-latency-cdf", "fig-expert-load", "fig-expert-imbalance", "fig-kv-transitions",
         "fig-kv-lifetimes", "fig-prefix-groups", "fig-acceptance-position", "fig-spec-speedup")
SKIPPED = ("note-gpu-activity", "note-kernel-categories", "note-roofline")
#: A Kineto trace with two kernels and a memcpy (and the runtime calls that launched them), and an
#: Nsight Compute raw page with the counters the roofline needs (duration, DRAM bytes, FP instructions).
KINETO = {"traceEvents": [
    *({"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 2.0, "pid": 100, "tid": 100,
       "args": {"correlation": corr}} for name, ts, corr in (("cudaMemcpyAsync", 0.5, 3), ("cudaLaunchKernel", 8.0, 1),
                                                              ("cudaLaunchKernel", 40.0, 2))),
    {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "ts": 10.0, "dur": 30.0, "pid": 0, "tid": 7,
     "args": {"device": 0, "stream": 7, "correlation": 1}},
    {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4, add>", "ts": 45.0,
     "dur": 5.0, "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7, "correlation": 2}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 1.0, "dur": 4.0, "pid": 0,
     "tid": 7, "args": {"device": 0, "stream": 7, "correlation": 3, "bytes": 4096}}]}
NCU_RAW = "\n".join([
    '"ID","Kernel Name","Device","Stream","Block Size","Grid Size","gpu__time_duration.sum","dram__bytes.sum",'
    '"sm__sass_thread_inst_executed_op_ffma_pred_on.sum","sm__sass_thread_inst_executed_op_fadd_pred_on.sum"',
    '"","","","","","","nsecond","byte","inst","inst"',
    '"0","ampere_sgemm_128x64_nn","0","7","(128, 1, 1)","(64, 1, 1)","10000","1000000","5000000","10"',
    '"1","vectorized_elementwise_kernel","0","7","(128, 1, 1)","(64, 1, 1)","2000","4000000","100000","100000"'])


def _ids(html: str) -> tuple[set[str], set[str]]:
    return set(re.findall(r'<img id="([^"]+)"', html)), set(re.findall(r'<p class="note" id="([^"]+)"', html))


def test_report_from_a_run(run_dir: Path) -> None:
    path = write_report(run_dir)
    assert path == run_dir / REPORT_NAME
    html = path.read_text()
    images, notes = _ids(html)
    assert images == set(DRAWN)
    assert notes == set(SKIPPED)
    assert "<script" not in html and "http://" not in html and "https://" not in html  # nothing to fetch
    assert re.search(r"<th>requests</th><td>6</td>", html)  # the header's summary numbers


def test_gpu_and_kernel_figures_from_synthetic_inputs(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    steps = pd.read_parquet(out / "events" / "steps.parquet")
    ts = np.linspace(steps["start_ns"].min(), steps["end_ns"].max(), 50).astype(np.int64)
    fields = ("tensor_active_ratio", "dram_active_ratio", "power_watts")
    pd.DataFrame({"ts_ns": np.tile(ts, len(fields)), "gpu": 0, "uuid": "GPU-0",
                  "field": np.repeat(fields, len(ts)), "value": np.tile(np.linspace(0.1, 0.9, len(ts)), len(fields)),
                  "instance": ""}).to_parquet(out / "events" / "gpu.parquet")
    (out / "captures").mkdir()
    (out / "captures" / "trace.json").write_text(json.dumps(KINETO))
    (out / "captures" / "kernels.csv").write_text(NCU_RAW)
    images, notes = _ids(write_report(out).read_text())
    assert images == {*DRAWN, "fig-gpu-activity", "fig-kernel-categories", "fig-roofline"}
    assert not notes


def test_a_broken_capture_is_a_note_not_a_failure(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    (out / "captures").mkdir()
    (out / "captures" / "broken.json").write_text('{"traceEvents": [')
    html = write_report(out).read_text()
    note = re.search(r'<p class="note" id="note-kernel-categories">([^<]*)</p>', html)
    assert note and "broken.json" in note.group(1)


@pytest.mark.parametrize("damage, message", [
    ("no_dir", "no such directory"),
    ("empty_dir", "missing summary.json"),
    ("no_events", "missing events"),
    ("corrupt_requests", "not a readable Parquet file"),
    ("bad_summary", "not valid JSON"),
    ("stream_lacks_columns", "lacks the columns"),
])
def test_bad_input_is_a_clear_value_error(run_dir: Path, tmp_path: Path, damage: str, message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    if damage != "no_dir":
        shutil.copytree(run_dir, out)
    if damage == "empty_dir":
        shutil.rmtree(out)
        out.mkdir()
    elif damage == "no_events":
        shutil.rmtree(out / "events")
    elif damage == "corrupt_requests":
        (out / "requests.parquet").write_bytes(b"not parquet")
    elif damage == "bad_summary":
        (out / "summary.json").write_text("{")
    elif damage == "stream_lacks_columns":
        pd.DataFrame({"step_id": [1]}).to_parquet(out / "events" / "moe.parquet")
    with pytest.raises(ValueError, match=message):
        write_report(out)
    assert main(["report", str(out)]) == 2  # the CLI: a message, exit code 2, no traceback
    err = capsys.readouterr().err
    assert err.startswith("infersight: error: ") and message in err and "Traceback" not in err


def test_demo_writes_the_report(demo_run) -> None:
    """The real demo (engine + agent process + workload, shared with the other demo tests): it ends by
    writing report.html."""
    out = demo_run.out
    assert f"report: {out / REPORT_NAME}" in demo_run.stdout.replace("\n", "")
    images, _ = _ids((out / REPORT_NAME).read_text())
    assert images == set(DRAWN)
