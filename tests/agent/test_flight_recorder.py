"""The flight recorder end to end on the CPU engine's real torch.profiler windows: the duty cycle and
what it folds into the kernel series, the budget under a real injected delay, triggered captures,
the summary block, the flags."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import pytest
import torch
from prometheus_client import generate_latest

from infersight.agent.api import report
from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.agent.recorder.config import RecorderConfig
from infersight.agent.service import Agent
from infersight.cli import main
from infersight.exporters import catalogue as C
from infersight.kernels.analysis.categories import CATEGORIES
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams, StepStats
from testkit import one_torch_thread, unique_ring

TINY = ModelConfig("rec-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                   max_seq_len=512)
#: Windows of 2 steps (1 charged after), triggers off unless a test turns one on.
QUIET = dict(window_steps=2, after_steps=1, min_interval_s=0.0, preemption_storm=None, step_jump=None)


@dataclass
class Run:
    agent: Agent
    probe: ProbeObserver
    engine: Engine
    steps: list[StepStats] = field(default_factory=list)

    def value(self, name: str, **labels: str) -> float:
        return self.agent.registry.get_sample_value(name, labels) or 0.0


def start(tmp_path, recorder: RecorderConfig, **agent: object) -> Run:
    ring = unique_ring("rec")
    probe = ProbeObserver(ProbeConfig(ring_name=ring, capture_dir=str(tmp_path / "captures")))
    engine = Engine(EngineConfig(model=TINY), probe)
    cfg = AgentConfig(rings=[ring], port=0, flight_recorder=recorder, **agent, gpu=GpuConfig(source="none"),
                      captures=CaptureConfig(token_file=str(tmp_path / "token"), min_interval_s=0.0))  # type: ignore[arg-type]
    return Run(Agent(cfg), probe, engine)


def drive(run: Run, requests: int, tokens: int, before_step=None, poll_every: int = 16) -> Run:
    """Requests of 20-token prompts, greedy; the agent polls every poll_every steps, as one beside an
    engine polls every 0.1 s. In one process its poll is a pause between two steps: windows are asked
    for at a poll and picked up at the next, so no poll falls inside the steps a window is charged for."""
    with one_torch_thread():
        for i in range(requests):
            run.engine.add_request([10 + i] * 20, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        while run.engine.has_unfinished():
            if before_step is not None:
                before_step(run)
            run.steps.append(run.engine.step())
            if len(run.steps) % poll_every == 0:
                run.agent.poll_once()
    for _ in range(3):
        run.agent.poll_once()
    return run


@pytest.fixture
def runs():
    made: list[Run] = []
    yield made
    for run in made:
        run.agent.close()
        run.probe.close()


def test_a_restarted_agent_starts_its_budget_from_the_costs_its_directory_kept(tmp_path, runs) -> None:
    """The first run measures its windows and keeps them in --recorder-dir; a second agent on the same
    directory reserves the dearest of those measured costs (not the 1 s guess) before it measures its own."""
    config = RecorderConfig(budget=0.45, initial_cost_s=0.002, directory=str(tmp_path / "rec"), **QUIET)
    first = drive(start(tmp_path, config), requests=4, tokens=150)
    runs.append(first)
    measured = [w["cost"]["cost_s"] for w in first.agent.recorder.store.recent()
                if w["kind"] == "window" and w["cost"] is not None]
    assert len(measured) >= 2, first.agent.recorder.store.recent()
    fresh = start(tmp_path, RecorderConfig(budget=0.005, directory=str(tmp_path / "rec"), **QUIET))
    runs.append(fresh)
    budget = fresh.agent.recorder.budget
    recent = measured[-budget.recent_windows:]
    assert budget.seeded == len(recent) and budget.measured == 0
    assert budget.reserve_s == pytest.approx(max(max(recent), 0.0)) and budget.reserve_s != 1.0
    fresh.agent.poll_once()
    assert report.summary(fresh.agent.state)["flight_recorder"]["reservation_from"] == \
        f"{len(recent)} kept windows' costs (measured)"
    alone = start(tmp_path, RecorderConfig(budget=0.005, **QUIET))  # no directory: the guess, said as one
    runs.append(alone)
    alone.agent.poll_once()
    block = report.summary(alone.agent.state)["flight_recorder"]
    assert block["window_reservation_s"] == 1.0 and block["reservation_from"] == "the initial guess 1 s (modelled)"


def test_windows_are_sampled_analysed_and_folded_into_kernel_series(tmp_path, runs, monkeypatch) -> None:
    # This host's CPU ceilings as `bench ceilings --device cpu` caches them (values of our choosing).
    from infersight.kernels.ceilings.ceiling_cache import CeilingMeasurement, host_cpu_name, torch_version, write_cache

    measured = CeilingMeasurement(host_cpu_name(), "float32", torch_version() or "none", "this-host",
                                  "2026-12-01T00:00:00Z", "perf_counter", 7.5, 1 << 28, 0.04, 2048, 5, 2)
    monkeypatch.setenv("INFERSIGHT_CEILINGS", str(tmp_path / "ceilings.json"))
    write_cache(measured)
    run = drive(start(tmp_path, RecorderConfig(budget=0.45, initial_cost_s=0.002, directory=str(tmp_path / "rec"),
                                               **QUIET)), requests=4, tokens=150)
    runs.append(run)
    windows = [w for w in run.agent.recorder.store.recent() if w["kind"] == "window"]
    assert len(windows) >= 2 and all("summary" in w for w in windows), windows
    assert run.value(C.RECORDER_WINDOWS.sample, outcome="analysed") == len(windows)
    # Each window is exactly window_steps engine steps from the one the engine says it began with;
    # the engine's own step records say which of them were decode steps.
    kind = {s.step_id: "decode" if s.num_prefill_tokens == 0 else "prefill" for s in run.steps}
    decode_steps = sum(kind[w["first_step"] + k] == "decode" for w in windows for k in range(2))
    assert run.value(C.KERNEL_SAMPLED_STEPS.sample, phase="decode") == decode_steps > 0
    assert run.value(C.KERNEL_SAMPLED_STEPS.sample, phase="sampling") == 2 * len(windows)  # every step samples
    # Time by category and phase: the tiny MoE's GEMMs, attention and routing, in decode; labels bounded.
    text = generate_latest(run.agent.registry).decode()
    series = [line for line in text.splitlines() if line.startswith(C.KERNEL_TIME.sample + "{")]
    cats = {line.split('category="')[1].split('"')[0] for line in series}
    assert {"GEMM", "attention-decode", "MoE routing"} <= cats <= set(CATEGORIES)
    assert run.value(C.KERNEL_TIME.sample, category="GEMM", phase="decode") > 0
    assert 0 < run.value(C.KERNEL_IDLE.sample, phase="decode") < run.value(C.KERNEL_STEP_WINDOW.sample, phase="decode")
    assert run.value(C.KERNEL_ACTIVITIES.sample, phase="decode") > 10 * decode_steps  # many ops per step
    # The roofline of the sampled steps, against this CPU's measured ceilings, named with their source.
    assert run.value(C.KERNEL_FLOPS.sample, category="GEMM") > 0 < run.value(C.KERNEL_ROOF_TIME.sample, category="GEMM")
    assert run.value(C.KERNEL_PEAK_FLOPS.name, ceiling=measured.device, source="measured") == measured.gemm_tflops * 1e12
    assert run.value(C.KERNEL_PEAK_BYTES.name, ceiling=measured.device, source="measured") == measured.copy_gbps * 1e9
    assert run.value(C.KERNEL_ROOF_FRACTION.name, category="GEMM") > 0
    said = windows[-1]["ceilings"]
    assert said["gbps_source"]["kind"] == "measured" and "this-host" in said["gbps_source"]["detail"]
    # Every window's cost was measured from the step records; the counters add them up.
    costs = [w["cost"]["cost_s"] for w in windows]
    assert run.value(C.RECORDER_COST.sample, kind="window") == pytest.approx(sum(costs))
    assert run.value(C.RECORDER_BUDGET.name) == 0.45
    rec = run.agent.recorder.budget
    assert rec.cost_s <= 0.45 * rec.engine_s + max(costs)  # the bucket's bound
    worked = sum(s.end_ns - s.start_ns for s in run.steps if s.batch) / 1e9
    assert run.value(C.RECORDER_ENGINE.sample) == pytest.approx(worked, abs=1e-6)
    # Kept in memory and on disk; the traces themselves are deleted once read.
    assert len(list((tmp_path / "rec").glob("window-*.json"))) == len(run.agent.recorder.store.recent())
    assert not list((tmp_path / "captures").glob("capture-*"))  # traces (plain .json) and shapes files
    block = report.summary(run.agent.state)["flight_recorder"]
    assert block["windows_measured"] == len(windows) and block["budget"] == 0.45
    assert abs(sum(block["last_window_category_shares"].values()) - 1.0) < 1e-9
    assert not torch.autograd.profiler._is_profiler_enabled


def delayed_export(run: Run, seconds: float) -> None:
    """A real delay in the engine's thread each time a window closes (the trace export's moment)."""
    stop = run.probe.capture._stop

    def slow() -> None:
        time.sleep(seconds)
        stop()

    run.probe.capture._stop = slow  # type: ignore[method-assign]


def test_a_costlier_window_is_measured_as_such_and_the_rate_drops(tmp_path, runs) -> None:
    delay = 0.2
    config = RecorderConfig(budget=0.45, initial_cost_s=0.002, **QUIET)
    plain = start(tmp_path / "a", config)
    slow = start(tmp_path / "b", config)
    runs += [plain, slow]
    delayed_export(slow, delay)
    drive(plain, requests=4, tokens=200)
    drive(slow, requests=4, tokens=200)
    got = {}
    for name, run in (("plain", plain), ("slow", slow)):
        costs = [w["cost"]["cost_s"] for w in run.agent.recorder.store.recent() if w["kind"] == "window"]
        rec = run.agent.recorder.budget
        assert costs and rec.cost_s <= 0.45 * rec.engine_s + max(costs), (name, costs, rec)
        got[name] = (costs, len(costs) / rec.engine_s, run.value(C.RECORDER_INTERVAL.name))
    # The injected delay is inside every delayed window's charged steps: each measures at least it
    # (baseline jitter could take off a few ms, never 10% of it).
    assert all(c >= 0.9 * delay for c in got["slow"][0]), got
    assert statistics.median(got["slow"][0]) > statistics.median(got["plain"][0]) + 0.5 * delay, got
    # And the recorder takes fewer windows per engine second, at a longer interval.
    assert got["slow"][1] < got["plain"][1] and got["slow"][2] > got["plain"][2], got


def slow_steps_after(step_id: int, seconds: float, run: Run) -> None:
    """A real slowdown inside every engine step after step_id (between its start and end stamps)."""
    begin = run.probe.on_step_begin

    def slower(sid: int, t_ns: int) -> None:
        if sid > step_id:
            time.sleep(seconds)
        begin(sid, t_ns)

    run.probe.on_step_begin = slower  # type: ignore[method-assign]


def test_a_step_time_jump_takes_one_full_capture_and_says_why(tmp_path, runs) -> None:
    # No windows (a budget that never covers a 10 s guess), the step-jump trigger at 6x: well above what
    # a shared machine's noise does to a median of 16 steps, well below the slowdown injected.
    run = start(tmp_path, RecorderConfig(budget=0.001, initial_cost_s=10.0, window_steps=2, step_jump=6.0,
                                         preemption_storm=None, trigger_steps=3))
    runs.append(run)
    slow_steps_after(48, 0.05, run)  # the tiny engine's decode steps take a few ms: +50 ms is over 10x
    drive(run, requests=2, tokens=90, poll_every=8)
    triggered = [r for r in run.agent.captures.records if r.reason.startswith("trigger ")]
    assert len(triggered) == 1, [r.reason for r in run.agent.captures.records]  # the cool-down holds the rest
    record = triggered[0]
    assert record.reason.startswith("trigger step_time_jump: decode step median") and record.steps == 3
    assert record.state == "done" and record.tool == "torch"
    first = run.agent.captures.first_step(record)
    assert first > 48 + 8  # the median of the last 16 decode steps turns with the 9th slow one
    assert run.value(C.RECORDER_TRIGGERED.sample, reason="step_time_jump") == 1
    assert run.value(C.RECORDER_TRIGGERED.sample, reason="slo_e2e") == 0  # every reason exported from the start
    assert run.value(C.RECORDER_COST.sample, kind="triggered") > 0  # measured like a window
    assert run.value(C.RECORDER_WINDOWS.sample, outcome="analysed") == 0
    block = report.summary(run.agent.state)["flight_recorder"]
    assert [t["reason"] for t in block["triggered_captures"]] == ["step_time_jump"]


def test_an_slo_breach_takes_a_full_capture(tmp_path, runs) -> None:
    run = start(tmp_path, RecorderConfig(budget=0.001, initial_cost_s=10.0, slo_min_requests=2, step_jump=None,
                                         preemption_storm=None, trigger_steps=2),
                slow=SlowRequestConfig(slo_e2e_s=1e-4))
    runs.append(run)
    drive(run, requests=2, tokens=4, poll_every=1)  # both finish well over a 0.1 ms e2e objective
    drive(run, requests=1, tokens=6, poll_every=1)  # the capture runs on these steps
    triggered = [r for r in run.agent.captures.records if r.reason.startswith("trigger ")]
    assert len(triggered) == 1 and triggered[0].reason.startswith("trigger slo_e2e: e2e p99 "), triggered
    assert "> SLO 0.0001 s over the last 2 requests" in triggered[0].reason
    assert run.value(C.RECORDER_TRIGGERED.sample, reason="slo_e2e") == 1


def test_windows_pause_the_gpu_profiling_counters(tmp_path, runs) -> None:
    run = start(tmp_path, RecorderConfig(budget=0.45, initial_cost_s=0.002, **QUIET))
    runs.append(run)
    calls: list[bool] = []
    pause = run.agent.gpu.pause_profiling

    def spy(paused: bool) -> None:
        calls.append(paused)
        pause(paused)

    run.agent.gpu.pause_profiling = spy  # type: ignore[method-assign]
    drive(run, requests=2, tokens=60, poll_every=8)
    for _ in range(5):  # a window asked for at drive's last polls has no steps to run on yet: give it some
        if not run.agent.captures.in_progress():
            break
        drive(run, requests=1, tokens=12, poll_every=8)
    assert run.value(C.RECORDER_WINDOWS.sample, outcome="analysed") >= 1
    # Paused while a window was asked for or running, and only then: paused, then not, at least once,
    # and paused now exactly when a window is still in flight.
    assert any(a and not b for a, b in zip(calls, calls[1:]))
    assert calls[-1] is bool(run.agent.captures.in_progress())
    assert run.agent.captures.window is not None and run.agent.captures.window.gpu_profiling == "paused"


def test_recorder_flags(capsys) -> None:
    for bad in (["--recorder-budget", "0.7"], ["--recorder-keep", "0"], ["--recorder-step-jump", "0.5"]):
        assert main(["agent", "--ring", "nothing-here", "--flight-recorder", *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "recorder" in err[0], err
    import argparse

    from infersight.agent.recorder.config import RecorderConfig

    parser = argparse.ArgumentParser()
    RecorderConfig.add_flags(parser)
    assert RecorderConfig.from_args(parser.parse_args([])) is None
    cfg = RecorderConfig.from_args(parser.parse_args(["--flight-recorder", "--recorder-budget", "0.01",
                                                      "--recorder-keep", "9", "--recorder-preemption-storm", "0",
                                                      "--recorder-dir", "/tmp/x"]))
    assert (cfg.budget, cfg.keep, cfg.preemption_storm, cfg.directory, cfg.step_jump) == (0.01, 9, None, "/tmp/x", 2.0)
