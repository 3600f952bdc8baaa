"""How decode runs while torch.profiler records: the choice each capture request carries
(probes.control.CaptureDecode). On the CPU: the decision, the control block, the capture window and
the engine passing it on; on a GPU (skipped without CUDA): a kernel-activity window replays the
decode graphs (cudaGraphLaunch in its trace) with the tokens of an eager engine, a full capture
stays eager with its per-layer ranges."""
from __future__ import annotations

import gzip
import json
import os
import struct
import time
from pathlib import Path

import pytest
import torch

from infersight.agent.capture.controller import CaptureController
from infersight.probes.config import ProbeConfig
from infersight.probes.control import CaptureDecode, CaptureState, CaptureTool, ControlBlock, control_name
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams
from infersight.runtime.runner.cuda_graphs import graph_step_allowed
from infersight.runtime.stats import StepStats

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DENSE = ModelConfig("graph-dense", d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=256)


def _name() -> str:
    return f"infersight-pdtest-{os.getpid()}-{time.monotonic_ns()}"


def test_graph_step_decision() -> None:
    # (profiling, request chose graphs, graph already captured) -> may the step run as a graph?
    assert graph_step_allowed(False, False, False) and graph_step_allowed(False, False, True)
    assert graph_step_allowed(False, True, False)      # no profiler: capture as usual
    assert not graph_step_allowed(True, False, True)   # a full capture: eager, per-layer ranges
    assert not graph_step_allowed(True, False, False)
    assert graph_step_allowed(True, True, True)        # a kernel-activity window: replay
    assert not graph_step_allowed(True, True, False)   # ... but never capture under the profiler


def test_control_block_carries_the_decode_choice() -> None:
    block = ControlBlock(_name(), create=True)
    try:
        block.request(3, CaptureTool.TORCH_KERNELS)
        assert block.decode is CaptureDecode.GRAPHS       # the window's default
        block.request(3, CaptureTool.TORCH)
        assert block.decode is CaptureDecode.EAGER        # the full capture's default
        block.request(3, CaptureTool.TORCH, CaptureDecode.GRAPHS)
        assert block.decode is CaptureDecode.GRAPHS       # chosen explicitly
        block.request(3, CaptureTool.TORCH_KERNELS, CaptureDecode.EAGER)
        assert block.decode is CaptureDecode.EAGER
        assert block.take() == (4, 3, CaptureTool.TORCH_KERNELS)  # the rest of the request unchanged
        struct.pack_into("<IBB", block.shm.buf, 24, 3, int(CaptureTool.TORCH_KERNELS), 0)  # names none
        assert block.decode is CaptureDecode.GRAPHS
        struct.pack_into("<IBB", block.shm.buf, 24, 3, int(CaptureTool.TORCH), 0)
        assert block.decode is CaptureDecode.EAGER
    finally:
        block.close()


def test_observer_reports_graph_replays_only_inside_a_graphs_window(tmp_path: Path) -> None:
    probe = ProbeObserver(ProbeConfig(ring_name=_name(), capture_dir=str(tmp_path)))
    agent_side = ControlBlock(control_name(probe.ring_name), create=False)
    step = 0

    def begin() -> bool:
        nonlocal step
        step += 1
        probe.on_step_begin(step, 0)
        return probe.decode_graphs_while_profiling

    try:
        seen = []
        for tool, decode in ((CaptureTool.TORCH_KERNELS, None), (CaptureTool.TORCH, None),
                             (CaptureTool.TORCH, CaptureDecode.GRAPHS)):
            before = begin()  # no window yet
            probe.on_step_end(StepStats(step, 0, 0))
            agent_side.request(2, tool, decode)
            inside = []
            for _ in range(2):
                inside.append(begin())
                probe.on_step_end(StepStats(step, 0, 0))
            after = begin()
            probe.on_step_end(StepStats(step, 0, 0))
            seen.append((before, inside, after))
        assert seen == [(False, [True, True], False), (False, [False, False], False),
                        (False, [True, True], False)]
        assert agent_side.state is CaptureState.DONE
    finally:
        agent_side.close()
        probe.close()


def test_engine_hands_the_choice_to_the_model_runner(tmp_path: Path) -> None:
    probe = ProbeObserver(ProbeConfig(ring_name=_name(), capture_dir=str(tmp_path)))
    engine = Engine(EngineConfig(model="tiny-draft", max_model_len=64), probe)
    flags: list[bool] = []
    run = engine.target.run

    def recording(items, expert_counts=None, graphs_while_profiling=False):  # noqa: ANN001, ANN202
        flags.append(graphs_while_profiling)
        return run(items, expert_counts, graphs_while_profiling)

    engine.target.run = recording  # type: ignore[method-assign]
    agent_side = ControlBlock(control_name(probe.ring_name), create=False)
    try:
        engine.add_request([5] * 8, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        engine.step()
        agent_side.request(2, CaptureTool.TORCH_KERNELS)
        for _ in range(3):
            engine.step()
        agent_side.request(2, CaptureTool.TORCH)
        for _ in range(2):
            engine.step()
        assert flags == [False, True, True, False, False, False]
    finally:
        agent_side.close()
        probe.close()


def test_a_window_begun_at_a_step_launched_ahead_starts_at_the_next_step(tmp_path: Path) -> None:
    """Async scheduling: a window's first begin can be a step launched before it (its work not
    profiled): that step is not the window's, and the window still holds the steps it asked for."""
    probe = ProbeObserver(ProbeConfig(ring_name=_name(), capture_dir=str(tmp_path)))
    probe.on_model(DENSE, 4)
    agent_side = ControlBlock(control_name(probe.ring_name), create=False)
    try:
        agent_side.request(2, CaptureTool.TORCH_KERNELS)
        probe.on_step_begin(5, 0)
        probe.on_step_end(StepStats(5, 0, 0, batch=[(1, 1)], context_lens=[9], launched_ahead=True))
        assert agent_side.first_step == 5 and agent_side.state is not CaptureState.DONE  # the trace's step 0
        for step_id in (6, 7):
            probe.on_step_begin(step_id, 0)
            probe.on_step_end(StepStats(step_id, 0, 0, batch=[(1, 1)], context_lens=[4 + step_id]))
        assert agent_side.state is CaptureState.DONE
        assert agent_side.path.endswith(".json")  # a recorder window's trace: plain JSON, read once
        shapes = json.loads(Path(agent_side.path.replace(".json", ".shapes.json")).read_text())
        assert shapes["first_step"] == 5 and [s["step_id"] for s in shapes["steps"]] == [6, 7]
    finally:
        agent_side.close()
        probe.close()


def test_agent_names_the_decode_mode_of_captures_and_windows() -> None:
    ring = _name()
    block = ControlBlock(control_name(ring), create=True)
    controller = CaptureController(min_interval_s=0)
    try:
        window = controller.request_window([ring], 3)
        assert window.decode == "graphs" and block.decode is CaptureDecode.GRAPHS
        block.take()  # the engine takes it and finishes
        block.set_state(CaptureState.DONE, "x")
        assert controller.poll_window() is window and window.state == "done"
        record = controller.request([ring], 3, "torch")
        assert record.decode == "eager" and block.decode is CaptureDecode.EAGER
        record.state = "done"
        record = controller.request([ring], 3, "torch", decode="graphs")
        assert record.decode == "graphs" and block.decode is CaptureDecode.GRAPHS
        record.state = "done"
        with pytest.raises(ValueError, match="decode"):
            controller.request([ring], 3, "torch", decode="fast")
    finally:
        controller.close()
        block.close()


# -- on a GPU -------------------------------------------------------------------------------------

def _config(enforce_eager: bool, async_scheduling: bool = False) -> EngineConfig:
    return EngineConfig(model=DENSE, device="cuda", dtype="float32", enforce_eager=enforce_eager, max_model_len=160,
                        num_kv_blocks=64, block_size=16, max_num_seqs=8, enable_prefix_caching=False,
                        async_scheduling=async_scheduling)


# Four sequences fill the graph's batch bucket (4): eager steps then run the same shapes, so their
# logits are bit-identical (cuda_graphs); contexts stay under 64 tokens: one width bucket, no capture
# needed inside the window.
PROMPTS = [[7 + i] * (12 + 5 * i) for i in range(4)]


def _run(engine: Engine, window: tuple[CaptureTool, int] | None) -> tuple[list[list[int]], list[int]]:
    """Greedy tokens of PROMPTS; with a window: asked for after 6 decode steps, the replay counts of its steps."""
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in PROMPTS]
    replays: list[int] = []
    agent_side = None
    steps = 0
    graphs = engine.target.graphs
    while engine.has_unfinished():
        if window is not None and steps == 7:
            agent_side = ControlBlock(control_name(engine.observer.ring_name), create=False)  # type: ignore[attr-defined]
            agent_side.request(window[1], window[0])
        before = graphs.num_replays if graphs is not None else 0
        engine.step()
        if agent_side is not None and len(replays) < window[1]:  # type: ignore[index]
            replays.append((graphs.num_replays if graphs is not None else 0) - before)
        steps += 1
    if agent_side is not None:
        agent_side.close()
    return [engine.release(i).token_ids for i in ids], replays


def _trace(probe: ProbeObserver) -> list[dict]:
    assert probe.control.state is CaptureState.DONE, probe.control.path
    return json.load(gzip.open(probe.control.path))["traceEvents"]


@cuda
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_kernel_window_replays_the_graphs_with_the_eager_tokens(tmp_path: Path, async_scheduling: bool) -> None:
    eager_tokens, _ = _run(Engine(_config(enforce_eager=True)), None)
    probe = ProbeObserver(ProbeConfig(ring_name=_name(), capture_dir=str(tmp_path)))
    try:
        engine = Engine(_config(enforce_eager=False, async_scheduling=async_scheduling), probe)
        tokens, replays = _run(engine, (CaptureTool.TORCH_KERNELS, 4))
        assert engine.target.graphs is not None and not engine.target.graphs.disabled
        events = _trace(probe)
    finally:
        probe.close()
    assert tokens == eager_tokens
    if not async_scheduling:  # async: the first call after the request reads a step launched before it
        assert replays == [1, 1, 1, 1]  # every window step a graph replay
    launches = {e["args"]["correlation"] for e in events if "cudaGraphLaunch" in e.get("name", "")}
    assert len(launches) == 4
    graph_kernels = [e for e in events if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launches]
    assert len(graph_kernels) >= 4 * 2 * DENSE.n_layers  # each replay ran the layers' kernels


@cuda
def test_full_capture_runs_decode_eagerly_with_layer_ranges(tmp_path: Path) -> None:
    probe = ProbeObserver(ProbeConfig(ring_name=_name(), capture_dir=str(tmp_path)))
    try:
        engine = Engine(_config(enforce_eager=False), probe)
        _, replays = _run(engine, (CaptureTool.TORCH, 3))
        events = _trace(probe)
    finally:
        probe.close()
    assert replays == [0, 0, 0]
    assert not any("cudaGraphLaunch" in e.get("name", "") for e in events)
    names = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert names.count("layer.0.attention") == 3
