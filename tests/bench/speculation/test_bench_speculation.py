"""bench.speculation.fixed_batch (the batch stays full, decode time is the engine's own step time) and a small
`infersight bench speculation` end to end through the CLI."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from testkit import one_torch_thread

from infersight.bench.speculation.fixed_batch import FixedBatchRun
from infersight.cli import main
from infersight.runtime import Engine, EngineConfig, ModelConfig
from infersight.workload import WorkloadConfig, WorkloadRequest, build_workload

TARGET = ModelConfig("fb-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                     max_seq_len=64)
REQUESTS = [WorkloadRequest(0.0, "code", "def f(x):", 9), WorkloadRequest(0.0, "code", "abc", 5),
            WorkloadRequest(0.0, "chat", "hello there", 7)]


def _drive(run: FixedBatchRun) -> list:
    stats = []
    engine_step = run.engine.step

    def recording_step():  # the engine's own StepStats, kept for the independent sums below
        stats.append(engine_step())
        return stats[-1]

    run.engine.step = recording_step  # type: ignore[method-assign]
    while run.step():
        pass
    return stats


def test_one_request_alone_decodes_in_every_step_after_its_first() -> None:
    with one_torch_thread():
        run = FixedBatchRun(Engine(EngineConfig(TARGET, block_size=8, num_kv_blocks=32)), REQUESTS[:1], batch=1)
        stats = _drive(run)
    # Step 1 prefills and gives the first token; steps 2.. decode one token each: 8 more.
    assert len(stats) == 9
    assert (run.tally["code"].tokens, run.tally["code"].ns) == (8, sum(s.end_ns - s.start_ns for s in stats[1:]))
    assert not run.engine.has_unfinished()


def test_the_batch_stays_full_until_every_listed_request_is_done() -> None:
    with one_torch_thread():
        run = FixedBatchRun(Engine(EngineConfig(TARGET, block_size=8, num_kv_blocks=32)), REQUESTS, batch=2)
        stats = _drive(run)
    assert [len(s.batch) for s in stats] == [2] * len(stats)  # fillers (not measured) keep it full
    assert run.tally["code"].tokens == 8 + 4 and run.tally["chat"].tokens == 6
    assert not run.engine.has_unfinished() and not run.engine.requests  # fillers aborted and released


def test_bench_speculation_cli(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    with one_torch_thread():
        assert main(["bench", "speculation", "--requests", "8", "--batch", "2", "--rounds", "1", "--max-tokens", "8",
                     "--probe-every", "2", "--try-gamma", "2", "--json", "--frames-out", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tasks"] >= 2 and result["dropped"] == 0 and 0 < result["probe_share"] <= 1
    tasks = {k.split(".")[0] for k in result if "." in k}
    assert tasks == {r.task for r in build_workload(WorkloadConfig(num_requests=8))}  # labels survive the warm-up
    for task in tasks:
        assert result[f"{task}.verdict"] in ("agrees", "contradicts", "inconclusive")
        assert result[f"{task}.measured_speedup"] > 0 and len(result[f"{task}.measured_rounds"]) == 1
        assert result[f"{task}.measured_speedup_gamma_2"] > 0 and result[f"{task}.best_gamma"] in (2, 4)
        assert result[f"{task}.advice"] in ("keep_speculation", "disable_speculation", "inconclusive", "none")
    assert result["tasks_agree"] + result["tasks_contradict"] <= result["tasks"]
    # --frames-out: every engine's steps as the client timed them; the probed engine's count is its observer's
    steps, recorded = pd.read_parquet(tmp_path / "steps.parquet"), pd.read_parquet(tmp_path / "step_timing.parquet")
    assert set(steps["arm"]) == {"plain", "spec", "probed", "spec@2"} and set(steps["task"]) == tasks
    assert len(steps[steps["arm"] == "probed"]) == len(recorded)
    assert (steps["client_ns"] > 0).all() and (steps["batch"] >= 1).all()
