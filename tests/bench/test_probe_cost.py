"""benchmarks/probe_cost.py in its CPU smoke mode: every variant gets one block per round, every
timed step is a full-batch decode step, and the `all` blocks write records the others do not."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "probe_cost.py"


def load_script():  # noqa: ANN201 -- the benchmark module
    spec = importlib.util.spec_from_file_location("probe_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("probe_cost", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_round_order_puts_each_variant_in_each_position_equally() -> None:
    bench = load_script()
    n = len(bench.VARIANTS)
    orders = [bench.round_order(r) for r in range(2 * n)]
    assert all(sorted(o) == sorted(bench.VARIANTS) for o in orders)
    for pos in range(n):
        assert Counter(o[pos] for o in orders) == {v: 2 for v in bench.VARIANTS}


def test_cpu_smoke_run() -> None:
    rounds, block, per_life = 5, 2, 2
    proc = subprocess.run([sys.executable, str(SCRIPT), "--batch", "2", "--context", "16", "--block-steps", str(block),
                           "--rounds", str(rounds), "--rounds-per-life", str(per_life), "--warmup-steps", "1",
                           "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {v: len(t) for v, t in result["times_ns"].items()} == {v: rounds for v in load_script().VARIANTS}
    assert result["lives"] == 3  # ceil(5 rounds / 2 per life)
    assert result["not_full_steps"] == 0 and result["dropped"] == 0
    assert result["records_per_step_all"] >= 2  # at least a STEP and a TOKENS record per decode step
    assert result["callback_us_per_step"] > 0
    assert set(result["ratio"]) == {"off2", "nvtx", "all", "timed"}
    assert result["noise_floor"] >= abs(result["ratio"]["off2"] - 1.0)


def test_bad_arguments_are_one_line_and_exit_2() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
