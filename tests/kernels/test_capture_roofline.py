"""The roofline of captured steps: batch and step work from hand formulas, a capture's shapes file,
ncu DRAM bytes against the byte model, and `infersight analyze --shapes` on a hand-written ncu CSV."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from infersight.cli import main
from infersight.kernels.analysis.categories import classify
from infersight.kernels.analysis.findings import byte_model_findings
from infersight.kernels.frames import KERNEL_COLUMNS, RANGE_COLUMNS, TraceError, typed_frame
from infersight.kernels.readers.ncu import parse_ncu_csv
from infersight.kernels.analysis.roofline import (
    DeviceCeilings, StepShape, analytic_work, batch_work, measured_dram_bytes, place_on_roofline, roofline_for_steps,
    steps_work, with_measured_bytes,
)
from infersight.kernels.readers.shapes import engine_step_ids, load_capture_shapes, shapes_path_for
from infersight.runtime.model.model_config import ModelConfig

REPO = Path(__file__).resolve().parents[2]
M = ModelConfig("t", d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=16, vocab_size=10)
# By hand: 2 layers, d 8, 2 heads of 4 (H*h = 8), 1 KV head (K*h = 4), FFN 16, vocabulary 10, bf16.
L, D, HH, KH, V, B = 2, 8, 8, 4, 10, 2
ATTN_W, FFN_W = D * HH + 2 * D * KH + HH * D, 3 * D * 16  # 192 and 384 weights per layer
WEIGHTS = L * (ATTN_W + FFN_W) + D * V  # 1232, read once per step
CEIL = DeviceCeilings("hand", peak_tflops=1.0, peak_gbps=100.0)
GEMM_K, DECODE_K, ELEM_K = "nvjet_tst_64x8_v_bz_TNT", "_paged_decode_split_kernel", "vectorized_elementwise_kernel"


def gemm(tokens: int, seqs: int) -> tuple[int, int]:
    return 2 * tokens * L * (ATTN_W + FFN_W) + 2 * seqs * D * V, WEIGHTS * B


def prefill(q: int, c: int) -> tuple[int, int]:
    return 4 * L * q * c * HH, L * (2 * q * HH + 2 * c * KH) * B


def decode(q: int, c: int) -> tuple[int, int]:
    return 4 * L * q * c * HH, 2 * L * c * KH * B


def add(*pairs: tuple[int, int]) -> tuple[int, int]:
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def work_of(frame: pd.DataFrame) -> dict[str, tuple[float, float]]:
    assert frame["op_category"].is_unique
    return {r.op_category: (r.flops, r.bytes) for r in frame.itertuples()}


def steps_frame(*steps: tuple[int, str, list[tuple[int, int, int]]]) -> pd.DataFrame:
    rows = [(sid, phase, *seq) for sid, phase, seqs in steps for seq in seqs]
    return pd.DataFrame(rows, columns=["step_id", "phase", "request_id", "query_len", "context_len"])


def kernels(rows: list[tuple[str, int, int]]) -> pd.DataFrame:
    """A kernels frame from (name, dur_ns, step_id) rows, back to back on one stream."""
    durs = [r[1] for r in rows]
    return typed_frame({"ts_ns": np.cumsum([0, *durs[:-1]]), "dur_ns": durs, "name": [r[0] for r in rows],
                        "category": "kernel", "device": 0, "stream": 7, "correlation": list(range(len(rows))),
                        "grid": None, "block": None, "bytes": 0, "range_path": "", "step_id": [r[2] for r in rows],
                        "source": "kineto"}, KERNEL_COLUMNS)


def test_mixed_batch_work_by_hand() -> None:
    # One prompt of 3 tokens and two decoding sequences (KV 9 and 12): 5 tokens, 3 sequences.
    work = batch_work(M, [3, 1, 1], [3, 9, 12])
    assert work_of(work) == {"GEMM": gemm(5, 3), "attention-prefill": prefill(3, 3),
                             "attention-decode": add(decode(1, 9), decode(1, 12))}
    assert work_of(work) == {"GEMM": (12000, 2464), "attention-prefill": (576, 288), "attention-decode": (1344, 672)}
    assert dict(work.dtypes.astype(str)) == {"op_category": "object", "flops": "float64", "bytes": "float64"}
    # decode= overrides query_len == 1: two speculative tokens still read the KV cache once.
    assert work_of(batch_work(M, [2], [10], decode=[True])) == {"GEMM": gemm(2, 1), "attention-decode": decode(2, 10)}
    assert work_of(batch_work(M, [1], [7], dtype_bytes=4))["GEMM"][1] == WEIGHTS * 4
    for shape in (StepShape("decode", 3, 1, 7), StepShape("prefill", 2, 4, 4), StepShape("decode", 2, 3, 9, 1)):
        n = shape.num_seqs
        pd.testing.assert_frame_equal(analytic_work(M, shape), batch_work(
            M, [shape.query_len] * n, [shape.context_len] * n, shape.dtype_bytes, [shape.phase == "decode"] * n))


def test_steps_work_verify_and_sum() -> None:
    verify = steps_frame((6, "verify", [(0, 3, 12), (1, 3, 15)]))
    assert work_of(steps_work(M, verify)) == {"GEMM": gemm(6, 2), "attention-decode": add(decode(3, 12), decode(3, 15))}
    two = steps_frame((5, "decode", [(0, 1, 9), (1, 1, 12)]), (6, "mixed", [(0, 1, 10), (1, 1, 13), (2, 4, 4)]))
    assert work_of(steps_work(M, two)) == {  # weights once per step: twice in all
        "GEMM": add(gemm(2, 2), gemm(6, 3)), "attention-prefill": prefill(4, 4),
        "attention-decode": add(decode(1, 9), decode(1, 12), decode(1, 10), decode(1, 13))}
    empty = steps_work(M, two.iloc[0:0])
    assert empty.empty and list(empty.columns) == ["op_category", "flops", "bytes"]


def test_roofline_for_steps_selects_kernels_by_step() -> None:
    steps = steps_frame((5, "decode", [(0, 1, 9), (1, 1, 12)]))
    k = classify(kernels([(GEMM_K, 1000, 5), (DECODE_K, 2000, 5), (ELEM_K, 300, 5), (GEMM_K, 500, 7)]))
    placed = roofline_for_steps(k, M, steps, 2, CEIL)
    # elementwise has no modelled work; step 7 is not listed.
    assert dict(zip(placed["op_category"], placed["kernel_ns"])) == {"GEMM": 1000, "attention-decode": 2000}
    assert work_of(placed) == {"GEMM": gemm(2, 2), "attention-decode": add(decode(1, 9), decode(1, 12))}
    assert placed.set_index("op_category").loc["GEMM", "achieved_tflops"] == pytest.approx(gemm(2, 2)[0] / 1e-6 / 1e12)
    unstepped = roofline_for_steps(k.assign(step_id=-1), M, steps, 2, CEIL)  # ncu: every kernel counts
    assert dict(zip(unstepped["op_category"], unstepped["kernel_ns"])) == {"GEMM": 1500, "attention-decode": 2000}
    assert roofline_for_steps(k, M, steps_frame((6, "decode", [(0, 1, 9)])), 2, CEIL).empty


# ncu --csv --page raw: header, units row (empty ID), one row per kernel; Mbyte = 1e6 B, Kbyte = 1e3 B.
NCU_CSV = """==PROF== Connected to process 4242
"ID","Kernel Name","Device","Stream","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"
"","","","","Mbyte","Kbyte","usecond"
"0","nvjet_tst_64x8_v_bz_TNT","0","7","1,000.00","12.50","2.00"
"1","_paged_decode_split_kernel","0","7","3.50","1,250.00","4.00"
"2","vectorized_elementwise_kernel","0","7","0.25","250.00","1.00"
"3","nvjet_tst_64x8_v_bz_TNT","0","7","2.00","500.00","1.50"
"""
MEASURED = {"GEMM": 1_000e6 + 12.5e3 + 2e6 + 500e3, "attention-decode": 3.5e6 + 1_250e3, "elementwise": 0.25e6 + 250e3}


def test_measured_dram_bytes_per_category() -> None:
    trace = parse_ncu_csv(NCU_CSV)
    k = classify(trace.kernels)
    assert list(k["op_category"]) == ["GEMM", "attention-decode", "elementwise", "GEMM"]
    assert measured_dram_bytes(k, trace.metrics).to_dict() == MEASURED
    read = trace.metrics[trace.metrics["metric"] != "dram__bytes_write.sum"]
    assert measured_dram_bytes(k, read).empty  # read without write: no total
    total = read.replace({"metric": {"dram__bytes_read.sum": "dram__bytes.sum"}})  # only dram__bytes.sum
    assert measured_dram_bytes(k, total).to_dict() == {"GEMM": 1002e6, "attention-decode": 3.5e6, "elementwise": 25e4}


def test_model_error_and_byte_findings() -> None:
    cats = ["GEMM", "attention-decode", "attention-prefill", "norm", "elementwise"]
    work = pd.DataFrame({"op_category": cats, "flops": 1e9, "bytes": 1e9})
    placed = place_on_roofline(work, pd.Series(1000, index=cats), CEIL)
    # measured / modelled: GEMM 1.6 (> 1.5: medium), decode 3.2 (> 2 * 1.5: high), prefill 1.2 (none),
    # norm 0.6 (< 1 / 1.5: info), elementwise not measured (none).
    measured = pd.Series({"GEMM": 1.6e9, "attention-decode": 3.2e9, "attention-prefill": 1.2e9, "norm": 0.6e9})
    out = with_measured_bytes(placed, measured)
    assert out["measured_bytes"].tolist()[:4] == [1.6e9, 3.2e9, 1.2e9, 0.6e9] and np.isnan(out["measured_bytes"][4])
    assert out["model_error"].tolist()[:4] == pytest.approx([1 / 1.6 - 1, 1 / 3.2 - 1, 1 / 1.2 - 1, 1 / 0.6 - 1])
    assert np.isnan(out["model_error"][4])
    found = byte_model_findings(out)
    assert [(f.severity, f.text.split(" (")[0]) for f in found] == [
        ("medium", "GEMM moves 1.6x the DRAM bytes it must"),
        ("high", "attention-decode moves 3.2x the DRAM bytes it must"),
        ("info", "norm moves only 0.60x the modelled bytes")]
    assert "1.6 GB measured by ncu vs 1 GB the work needs" in found[0].text
    assert byte_model_findings(with_measured_bytes(placed, pd.Series({"GEMM": 0.7e9, "norm": 1.5e9}))) == []
    assert byte_model_findings(placed) == []  # no ncu bytes, no findings


def write_shapes(tmp: Path, name: str = "capture-1-2.shapes.json", drop: tuple[str, ...] = (), **override: Any) -> Path:
    doc = {"format": "infersight-capture-shapes/1", "model": dataclasses.asdict(M), "dtype_bytes": 2, "first_step": 5,
           "steps": [{"step_id": 5, "phase": "decode", "seqs": [[0, 1, 9], [1, 1, 12]]},
                     {"step_id": 6, "phase": "mixed", "seqs": [[0, 1, 10], [1, 1, 13], [2, 4, 4]]}]}
    doc = {k: v for k, v in {**doc, **override}.items() if k not in drop}
    (tmp / name).write_text(json.dumps(doc))
    return tmp / name


def test_load_capture_shapes(tmp_path: Path) -> None:
    shapes = load_capture_shapes(write_shapes(tmp_path))
    assert shapes.model == M and shapes.dtype_bytes == 2 and shapes.first_step == 5
    expected = pd.DataFrame({"step_id": [5, 5, 6, 6, 6], "phase": ["decode"] * 2 + ["mixed"] * 3,
                             "request_id": [0, 1, 0, 1, 2], "query_len": [1, 1, 1, 1, 4],
                             "context_len": [9, 12, 10, 13, 4]}).astype({"step_id": "int64", "phase": "object"})
    pd.testing.assert_frame_equal(shapes.steps, expected)
    later = [{"step_id": s, "phase": "decode", "seqs": [[0, 1, 9]]} for s in (8, 7)]
    assert load_capture_shapes(write_shapes(tmp_path, drop=("first_step",), steps=later)).first_step == 7


def test_shapes_path_for() -> None:
    for given in ("dir/capture-1-2.json.gz", "dir/capture-1-2.json", "dir/capture-1-2.shapes.json"):
        assert shapes_path_for(given) == Path("dir/capture-1-2.shapes.json")


def step_ranges(payloads: list[int | None], kind: str = "cpu") -> pd.DataFrame:
    n = len(payloads)
    return typed_frame({"name": "step", "ts_ns": [100 * i for i in range(n)], "dur_ns": 100, "depth": 0, "path": "step",
                        "process": 1, "thread": 1, "kind": kind, "domain": "", "payload": pd.array(payloads, "Int64"),
                        "step_id": list(range(n)), "source": "kineto"}, RANGE_COLUMNS)


def test_engine_step_ids() -> None:
    k = kernels([(GEMM_K, 10, 0), (DECODE_K, 10, 1), (ELEM_K, 10, -1)])
    assert engine_step_ids(k, step_ranges([None, None]), 5)["step_id"].tolist() == [5, 6, -1]  # Kineto ordinals
    assert k["step_id"].tolist() == [0, 1, -1]  # input untouched
    nsys = k.assign(step_id=[41, 42, -1])
    assert engine_step_ids(nsys, step_ranges([41, 42]), 5)["step_id"].tolist() == [41, 42, -1]
    with_gpu_copies = pd.concat([step_ranges([41, 42]), step_ranges([None, None], kind="gpu")], ignore_index=True)
    assert engine_step_ids(nsys, with_gpu_copies, 5)["step_id"].tolist() == [41, 42, -1]


def test_analyze_ncu_with_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ncu.csv").write_text(NCU_CSV)
    args = ["analyze", str(tmp_path / "ncu.csv"), "--shapes", str(write_shapes(tmp_path))]
    assert main([*args, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["op_category"]: r for r in report["roofline"]}  # elementwise: no work; prefill: no kernel
    assert set(rows) == {"GEMM", "attention-decode"} and {r["phase"] for r in rows.values()} == {"captured"}
    g, a = rows["GEMM"], rows["attention-decode"]
    assert (g["kernel_ns"], g["bytes"], g["measured_bytes"]) == (3500, 2 * WEIGHTS * B, MEASURED["GEMM"])
    decode_bytes = add(decode(1, 9), decode(1, 12), decode(1, 10), decode(1, 13))[1]
    assert (a["kernel_ns"], a["bytes"], a["measured_bytes"]) == (4000, decode_bytes, MEASURED["attention-decode"])
    assert g["model_error"] == pytest.approx(2 * WEIGHTS * B / MEASURED["GEMM"] - 1)
    moves = [(f["severity"], f["text"].split(" moves ")[0]) for f in report["findings"] if " moves " in f["text"]]
    assert moves == [("high", "GEMM"), ("high", "attention-decode")]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("bytes: modelled vs measured (ncu DRAM read + write)")
    # GEMM: 4928 B modelled, 1,002,512,500 B measured: -100.0% to one decimal.
    assert lines[at + 2].split() == ["captured", "GEMM", "0.0000", "1.0025", "-100.0%"]


SHORT_KV = [{"step_id": 5, "phase": "prefill", "seqs": [[0, 4, 3]]}]  # 4 tokens fed, KV length 3
BAD_SHAPES = {  # name: (the file's text, or write_shapes' changes; what the message says)
    "not_json.shapes.json": ("{not json", "invalid JSON"),
    "wrong_format.shapes.json": (json.dumps({"format": "other/1"}), '"format": "infersight-capture-shapes/1"'),
    "no_steps.shapes.json": ({"drop": ("steps",)}, "malformed shapes file (KeyError: 'steps')"),
    "short_kv.shapes.json": ({"steps": SHORT_KV}, "KV length >= tokens"),
    "first_step_list.shapes.json": ({"first_step": [5]}, "malformed shapes file (TypeError"),
    "zero_heads.shapes.json": ({"model": {**dataclasses.asdict(M), "n_heads": 0}}, "n_heads must be a positive"),
    "infinite_dtype.shapes.json": ({"dtype_bytes": float("inf")}, "malformed shapes file (OverflowError"),
    "unknown_phase.shapes.json": ({"steps": [{"step_id": 5, "phase": "banana", "seqs": [[0, 1, 3]]}]},
                                  "unknown step phase 'banana'"),
}


@pytest.mark.parametrize("name", list(BAD_SHAPES))
def test_bad_shapes_file_exit_2(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, message = BAD_SHAPES[name]
    if isinstance(content, dict):
        path = write_shapes(tmp_path, name, **content)
    else:
        path = tmp_path / name
        path.write_text(content)
    with pytest.raises(TraceError) as err:
        load_capture_shapes(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)
    (tmp_path / "ncu.csv").write_text(NCU_CSV)
    assert main(["analyze", str(tmp_path / "ncu.csv"), "--shapes", str(path)]) == 2
    done = capsys.readouterr()
    lines = done.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infersight: error: ") and done.out == ""
    assert name in lines[0] and message in lines[0]


def test_bad_shapes_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "ncu.csv").write_text(NCU_CSV)
    (tmp_path / "x.shapes.json").write_text("[1, 2]")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "infersight", "analyze", str(tmp_path / "ncu.csv"), "--shapes",
                           str(tmp_path / "x.shapes.json")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not a shapes file" in done.stderr
