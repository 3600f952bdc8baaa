"""benchmarks/gpu.sh expert_parallel_cpu: the GPU suite's gloo path, W = 4 CPU ranks on tiny-moe, runs
ep_bench.py end to end and writes its report under $OUT. Expected figures come from the model's
shape and the request mix, not from the bench."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from infersight.runtime.config import resolve_model
from infersight.runtime.model.weights import build_model

ROOT = Path(__file__).resolve().parents[2]
WORLD, BATCH, STEPS, TOP_K, D_MODEL, FFN = 4, 8, 12, 2, 256, 128  # the script's cpu flags, tiny-moe


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep_bench")
    env = {**os.environ, "OUT": str(out), "PY": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "expert_parallel_cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (out / "expert_parallel_cpu.log").read_text()
    assert "rc=0" in log, log[-3000:]
    return json.loads((out / "ep_w4_tiny-moe_0l.json").read_text())


def test_an_unknown_suite_is_one_line_and_exit_2():
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "x3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_report_shape(report):
    assert (report["world"], report["backend"], report["measured_steps"]) == (WORLD, "gloo", STEPS)
    for run in ("before", "after"):
        r = report[run]
        assert 0 < r["a2a_share"] < r["comm_share"] < 1
        assert len(r["straggler_by_step"]) == len(r["straggler_skew_by_step"]) == STEPS
        assert set(r["straggler_by_step"]) <= set(range(WORLD)) and min(r["straggler_skew_by_step"]) >= 1
        assert sum(r["straggler_steps"]) == STEPS
    assert [p["layer"] for p in report["plan_vs_measured"]] == [0, 1, 2, 3]


def test_bytes_per_peer_rows_are_a_shard_of_float32_rows(report):
    """Decode steps of 8 requests on 4 ranks: each rank sources 2 tokens, 2 pairs each, one
    256-wide float32 row per pair, whichever peers they go to."""
    for run in ("before", "after"):
        matrix = report[run]["bytes_per_peer_per_layer_step"]
        assert len(matrix) == WORLD and all(len(row) == WORLD for row in matrix)
        for row in matrix:
            assert sum(row) == pytest.approx(BATCH // WORLD * TOP_K * D_MODEL * 4)


def test_each_rank_holds_its_experts_only(report):
    cfg = resolve_model("tiny-moe")
    full = sum(p.numel() * 4 for p in build_model(cfg, dtype=torch.float32, device="cpu", seed=0).parameters())
    expert = 3 * D_MODEL * FFN * 4
    home = full - cfg.n_layers * (cfg.n_experts - cfg.n_experts // WORLD) * expert
    assert report["before"]["param_bytes_by_rank"] == [home] * WORLD
    copies = Counter(rank for reps in report["plan_replicas"].values() for _, rank in reps)
    assert report["after"]["param_bytes_by_rank"] == [home + copies[r] * expert for r in range(WORLD)]
