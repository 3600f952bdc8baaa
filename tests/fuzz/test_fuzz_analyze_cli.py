"""`python -m infersight analyze` end to end on bad files and flags: exit code 2, exactly one line
on stderr (no "Traceback", no pandas / numpy warning), nothing on stdout, within a time bound. The
issue-17 cases by name (FIFO, device, directory, --batch 99999999999, ts 1e999999, a 131 k
field, a huge id), a run past --time-limit, and seeded mutations of a real trace."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fuzzkit import mutations
from real_inputs import OUR_KINETO, kineto_seeds

REPO = Path(__file__).resolve().parents[2]
BOUND_S = 60.0  # generous: a bare CLI start is ~1-2 s here, up to 10x that on a loaded 2-core CI machine


def _start(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "infersight", "analyze", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_all(cases: dict[str, list[str]]) -> dict[str, tuple[int, str, str, float]]:
    """Every case's (exit code, stdout, stderr, seconds); started together so the imports overlap."""
    started = {name: (_start(*args), time.monotonic()) for name, args in cases.items()}
    done = {}
    for name, (proc, t0) in started.items():
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"{name}: still running after {BOUND_S} s")
        done[name] = (proc.returncode, out, err, time.monotonic() - t0)
    return done


def _assert_one_line_error(name: str, result: tuple[int, str, str, float], words: str = "") -> None:
    code, out, err, _ = result
    assert code == 2, f"{name}: exit {code}, stderr {err[-500:]!r}"
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("infersight: error: "), f"{name}: {err!r}"
    assert words in err, f"{name}: {err!r}"
    assert out == "", f"{name}: {out[:200]!r}"


def test_bad_files_and_flags(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)  # nothing ever writes it: opening it for reading would block forever
    big_ts = tmp_path / "ts.json"
    big_ts.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e999999, "dur": 1}]}')
    big_id = tmp_path / "id.json"  # 113 bytes that used to cost 32 s
    big_id.write_text('{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2,"pid":1e999999,"tid":1e999999}]}')
    long_field = tmp_path / "long.csv"
    long_field.write_text('"ID","Kernel Name","Metric Name","Metric Value"\n"0","k","m","' + "x" * 131_073 + '"\n')
    shapes = tmp_path / "capture-1-2.shapes.json"
    shapes.write_text('{"format": "infersight-capture-shapes/1", "first_step": 1e308}')
    flags = {  # argparse's own usage error: the usage lines, then one error line naming the flag and range
        "batch": ([str(OUR_KINETO), "--model", "tiny-moe", "--batch", "99999999999", "--context", "8"],
                  "argument --batch: 99999999999 is out of range: expected 1 to 1048576"),
        "peak": ([str(OUR_KINETO), "--peak-tflops", "inf"], "argument --peak-tflops: inf is out of range"),
        "top": ([str(OUR_KINETO), "--top", "1e9"], "argument --top: expected an integer"),
    }
    cases = {
        "fifo": ([str(fifo)], "FIFO"), "directory": ([str(tmp_path)], "directory"),
        "device": (["/dev/zero"], "character device"), "missing": ([str(tmp_path / "nope.json")], "cannot read"),
        "ts_1e999999": ([str(big_ts)], "no GPU kernel"), "long_field": ([str(long_field)], "field larger"),
        "shapes_first_step": ([str(big_id), "--shapes", str(shapes)], "shapes file"),
        "max_bytes": ([str(OUR_KINETO), "--max-bytes", "1000"], "over the limit"),
        "time_limit": ([str(OUR_KINETO), "--time-limit", "0.5"], "not analysed within 0.5 s"),
    }
    good = {"huge_id": [str(big_id), "--format", "json", "--time-limit", "30"]}  # read, its ids as unknown (-1)
    results = _run_all({**good, **{name: args for name, (args, _) in {**cases, **flags}.items()}})
    code, out, err, _ = results["huge_id"]
    assert code == 0 and err == "" and json.loads(out)["kernels"]["count"] == 1, err
    for name, (_, words) in cases.items():
        _assert_one_line_error(name, results[name], words)
    for name, (_, words) in flags.items():
        code, out, err, _ = results[name]
        assert code == 2 and "Traceback" not in err and out == "", f"{name}: {err!r}"
        # one line, argparse's usage text left behind --help
        assert err.count("\n") == 1 and err.startswith("infersight analyze: error: ") and words in err, f"{name}: {err!r}"
    assert results["fifo"][3] < BOUND_S and results["time_limit"][3] < BOUND_S


def test_mutated_traces_end_in_a_report_or_one_line(tmp_path: Path) -> None:
    cases = {}
    for i, case in enumerate(mutations(kineto_seeds(), 4, seed=1707)):
        (tmp_path / f"m{i}.json").write_bytes(case)
        cases[f"m{i}"] = [str(tmp_path / f"m{i}.json"), "--format", "json"]
    for name, (code, out, err, _) in _run_all(cases).items():
        if code == 0:
            assert err == "" and json.loads(out)["source"] == "kineto", name
        else:
            _assert_one_line_error(name, (code, out, err, 0.0))
