"""Async scheduling (runtime.engine.async_steps): the engine that launches steady decode steps ahead gives
the synchronous engine's tokens, finish reasons, steps and expert counts; on the CPU (every step)
and, on a GPU, with CUDA graphs fed on the device (skipped without CUDA). The synchronous engine,
stepped alongside on the same requests, is the reference."""
from __future__ import annotations

import pytest
import torch

from infersight.runtime import Engine, ModelConfig, SamplingParams
from infersight.runtime.config import EngineConfig
from infersight.runtime.runner.graph_inputs import DecodeInputs, DecodeRow, DecodeRows
from infersight.runtime.observer import EngineObserver

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DENSE = ModelConfig("async-dense", d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=256)
PROMPTS = [[1 + i, 2, 3, 4 + i] * (3 + i) for i in range(6)]


class StepLog(EngineObserver):
    """Every step's begin and end as the observer sees them, and each step's expert counts."""

    def __init__(self, moe: bool = False) -> None:
        self.wants_expert_counts = moe
        self.events: list[tuple[str, int, int]] = []
        self.counts: dict[int, list[list[int]]] = {}

    def on_step_begin(self, step_id: int, t_ns: int) -> None:
        self.events.append(("begin", step_id, t_ns))

    def on_step_end(self, stats) -> None:  # type: ignore[no-untyped-def]
        self.events.append(("end", stats.step_id, stats.end_ns))

    def on_expert_counts(self, step_id: int, counts: torch.Tensor) -> None:
        self.counts[step_id] = counts.cpu().tolist()


def run(async_scheduling: bool, model: str | ModelConfig = "tiny-moe", maxes: tuple[int, ...] = (20, 9, 33, 5),
        eos: int | None = None, max_num_seqs: int = 4, device: str = "cpu", dtype: str = "float32",
        observer: EngineObserver | None = None, abort: tuple[int, int] | None = None,
        params: SamplingParams | None = None, **config: object):
    """Requests one per max_tokens; (outputs, finish reasons, per-step (batch, finished, ahead), engine).
    eos: the tokenizer's EOS id for this run (EOS then ends requests); abort: (step, request) to abort
    after that many steps."""
    engine = Engine(EngineConfig(model=model, device=device, dtype=dtype, max_num_seqs=max_num_seqs,
                                 async_scheduling=async_scheduling, max_model_len=160, num_kv_blocks=64, **config),
                    observer)
    if eos is not None:
        engine.tokenizer.eos_id = eos
    ids = [engine.add_request(PROMPTS[i % len(PROMPTS)], params or SamplingParams(
        temperature=0.0, max_tokens=m, ignore_eos=eos is None)) for i, m in enumerate(maxes)]
    steps = []
    while engine.has_unfinished():
        stats = engine.step()
        steps.append((tuple(stats.batch), tuple(stats.finished), stats.launched_ahead))
        if abort is not None and len(steps) == abort[0]:
            engine.abort_request(ids[abort[1]])
    outputs = [engine.requests[i].output_token_ids for i in ids]
    reasons = [engine.requests[i].finish_reason for i in ids]
    return outputs, reasons, steps, engine


def strip(steps):
    return [(batch, finished) for batch, finished, _ in steps]


@pytest.mark.parametrize("model", ["tiny-moe", DENSE])
def test_steady_decode_gives_the_synchronous_tokens_and_steps(model) -> None:
    sync_out, sync_reasons, sync_steps, _ = run(False, model)
    out, reasons, steps, engine = run(True, model)
    assert out == sync_out and reasons == sync_reasons == ["length"] * 4
    assert strip(steps) == strip(sync_steps)  # no request waits: the very same steps
    ahead = sum(a for _, _, a in steps)
    # Every decode step but those after a step that ended a request by length (one per distinct end)
    # and the first after the prefill: counted from the synchronous run's own steps.
    decode_steps = sum(1 for batch, _, in strip(sync_steps) if all(n == 1 for _, n in batch))
    ends = len({i for _, finished in strip(sync_steps) for i in finished})
    assert ahead >= decode_steps - ends - 1 and ahead > 0
    assert engine.kv.pool.num_in_use == 0 and engine.inflight is None


def test_eos_found_one_step_late_drops_the_extra_token() -> None:
    first, _, _, _ = run(False)
    # The first token of request 2 from its 6th on that it had not emitted before: as EOS, it ends
    # request 2 there (and any other request that emits it).
    k = next(k for k in range(5, len(first[2])) if first[2][k] not in first[2][:k])
    sync_out, sync_reasons, sync_steps, _ = run(False, eos=first[2][k])
    out, reasons, steps, engine = run(True, eos=first[2][k])
    assert sync_reasons[2] == "stop" and len(sync_out[2]) == k + 1
    assert out == sync_out and reasons == sync_reasons
    assert strip(steps) == strip(sync_steps)  # the extra row is not reported in the step after
    ended = next(i for i, (_, finished, _) in enumerate(steps) if 2 in finished)
    assert steps[ended + 1][2]  # that step was launched with request 2 in it, before its EOS was read
    assert engine.kv.pool.num_in_use == 0


def test_waiting_requests_get_the_same_tokens_one_step_later() -> None:
    maxes = (12, 7, 30, 5, 18, 9)  # six requests, four slots: two wait for a slot to free
    sync_out, sync_reasons, sync_steps, _ = run(False, maxes=maxes)
    out, reasons, steps, engine = run(True, maxes=maxes)
    assert out == sync_out and reasons == sync_reasons
    first = {rid: next(i for i, (b, _) in enumerate(strip(sync_steps)) if rid in dict(b)) for rid in (4, 5)}
    late = {rid: next(i for i, (b, _, _) in enumerate(steps) if rid in dict(b)) for rid in (4, 5)}
    assert all(late[r] - first[r] in (0, 1) for r in (4, 5)), (first, late)
    assert engine.kv.pool.num_in_use == 0


def test_an_abort_while_the_next_step_runs_loses_nothing_else() -> None:
    sync_out, _, _, _ = run(False)
    out, reasons, steps, engine = run(True, abort=(6, 2))
    assert steps[6][2]  # the step after the abort was already in flight
    assert reasons[2] == "abort" and out[2] == sync_out[2][:len(out[2])] and 0 < len(out[2]) < len(sync_out[2])
    assert [o for i, o in enumerate(out) if i != 2] == [o for i, o in enumerate(sync_out) if i != 2]
    assert all(2 not in dict(batch) for batch, _, _ in steps[7:])
    assert engine.kv.pool.num_in_use == 0


def test_aborting_every_request_ends_the_step_in_flight_at_once() -> None:
    log = StepLog()
    engine = Engine(EngineConfig(model="tiny-moe", async_scheduling=True, max_model_len=160, num_kv_blocks=64), log)
    ids = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)) for p in PROMPTS[:2]]
    for _ in range(4):
        engine.step()
    assert engine.inflight is not None and log.events[-1][0] == "begin"  # step 5 announced, in flight
    for rid in ids:
        engine.abort_request(rid)
    assert engine.inflight is None and log.events[-1][:2] == ("end", 5) and not engine.has_unfinished()
    rid = engine.add_request(PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    ids_begun = [i for k, i, _ in log.events if k == "begin"]
    assert ids_begun == sorted(set(ids_begun)) and ids_begun[5] == 6  # no id announced twice
    assert [k for k, _, _ in log.events] == ["begin", "end"] * len(ids_begun)
    assert len(engine.requests[rid].output_token_ids) == 3 and engine.kv.pool.num_in_use == 0


def test_the_steps_tile_time_and_expert_counts_are_each_steps_own() -> None:
    sync_log, log = StepLog(moe=True), StepLog(moe=True)
    run(False, observer=sync_log)
    run(True, observer=log)
    kinds = [(k, i) for k, i, _ in log.events]
    assert kinds == [(k, i) for k, i, _ in sync_log.events]  # begin 1, end 1, begin 2, ... in order
    ends = {i: t for k, i, t in log.events if k == "end"}
    begins = {i: t for k, i, t in log.events if k == "begin"}
    assert all(begins[i] >= ends[i - 1] for i in begins if i - 1 in ends)
    assert log.counts == sync_log.counts  # token counts per layer and expert, step by step


def test_sampled_steps_run_ahead_with_the_synchronous_tokens() -> None:
    """A request's draw is keyed by (its seed, the tokens it drew before), counted with the one the
    step in flight adds: the same tokens as one step at a time, greedy rows mixed in."""
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=12, ignore_eos=True, seed=3)
    sync_out, _, _, _ = run(False, params=params)
    out, _, steps, _ = run(True, params=params)
    assert out == sync_out and sum(a for _, _, a in steps) >= 5
    mixed = [SamplingParams(temperature=t, max_tokens=m, ignore_eos=True, seed=i)
             for i, (t, m) in enumerate(((0.0, 20), (1.3, 9), (0.7, 33), (0.0, 5)))]
    outs = []
    for ahead in (False, True):
        engine = Engine(EngineConfig(model="tiny-moe", max_num_seqs=4, async_scheduling=ahead, max_model_len=160,
                                     num_kv_blocks=64))
        ids = [engine.add_request(PROMPTS[i % len(PROMPTS)], p) for i, p in enumerate(mixed)]
        launched = 0
        while engine.has_unfinished():
            launched += engine.step().launched_ahead
        outs.append([engine.requests[i].output_token_ids for i in ids])
        assert (launched > 0) == ahead
    assert outs[0] == outs[1] and [len(o) for o in outs[0]] == [20, 9, 33, 5]


def test_a_failed_draw_in_a_step_run_ahead_fails_its_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched draw raises: each row is drawn alone as the synchronous engine draws it; the
    request whose own draw raises ends with reason "error", the others get the synchronous tokens."""
    from infersight.runtime.engine import step_rows as engine_module  # the rows' sample, sample_batch and verify
    from infersight.runtime.engine import async_steps

    params = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=3)
    victim_generator: list[torch.Generator] = []
    real_sample = engine_module.sample

    def failing_batch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("injected batch fault")

    def failing_sample(probs: torch.Tensor, generator: torch.Generator) -> int:
        if victim_generator and generator is victim_generator[0]:
            raise RuntimeError("injected sampling fault")
        return real_sample(probs, generator)

    outs = []
    for ahead in (False, True):
        for module in (engine_module, async_steps):
            monkeypatch.setattr(module, "sample_batch", failing_batch)
            monkeypatch.setattr(module, "sample", failing_sample)
        engine = Engine(EngineConfig(model="tiny-moe", max_num_seqs=4, async_scheduling=ahead, max_model_len=160,
                                     num_kv_blocks=64))
        ids = [engine.add_request(PROMPTS[i % len(PROMPTS)], params) for i in range(3)]
        victim_generator[:] = []
        launched = 0
        while engine.has_unfinished():
            stats = engine.step()
            launched += stats.launched_ahead
            if not victim_generator and len(engine.requests[ids[1]].output_token_ids) >= 4:
                victim_generator.append(engine.requests[ids[1]].generator)
        reqs = [engine.requests[i] for i in ids]
        assert [r.finish_reason for r in reqs] == ["length", "error", "length"]
        assert str(reqs[1].error) == "injected sampling fault"
        outs.append([r.output_token_ids for i, r in enumerate(reqs) if i != 1])
        assert engine.kv.pool.num_in_use == 0 and (launched > 0) == ahead
    assert outs[0] == outs[1]


def test_profiled_steps_stay_synchronous() -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        _, _, steps, _ = run(True, maxes=(6, 6))
    assert not any(a for _, _, a in steps)


def test_async_scheduling_defaults_on_for_cuda() -> None:
    """vLLM's default: on where it is supported. The CPU's forward runs on the host: nothing to overlap.
    With a speculative model too: there only the plain probe runs are launched ahead (test_spec_probe)."""
    assert EngineConfig(model="tiny-moe").async_scheduling is False
    assert EngineConfig(model="tiny-moe", device="cuda").async_scheduling is True
    assert EngineConfig(model="tiny-moe", device="cuda:1").async_scheduling is True
    assert EngineConfig(model="tiny-moe", device="cuda", speculative_model="tiny-draft").async_scheduling is True
    assert EngineConfig(model="tiny-moe", device="cuda", async_scheduling=False).async_scheduling is False
    assert EngineConfig(model="tiny-moe", async_scheduling=True).async_scheduling is True


def test_two_staging_buffers_alternate_and_carry_token_sources() -> None:
    inputs = DecodeInputs(max_batch=4, max_blocks=8, block_size=4, pad_block=10, device="cpu", staging=2)
    a, b = DecodeRow(11, 9, 9, [5, 7, 2]), DecodeRow(12, 0, 12, [3])
    seen = []
    for src in (None, [1, 0], [0, -1]):
        rows = DecodeRows.of([a, b])
        rows.src = src
        inputs.fill(rows, bucket=4, width=4)
        seen.append(inputs.host.data_ptr())
        batch = inputs.batch(4, 4)
        assert inputs.token_src(4).tolist() == (src or [-1, -1]) + [-1, -1]
        assert batch.decode_block_tables[0, :3].tolist() == [5, 7, 2] and batch.decode_block_tables[1, 0] == 3
        assert batch.input_ids.tolist() == [11, 12, 0, 0]
    assert seen[0] == seen[2] != seen[1]


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", [DENSE, "tiny-moe"])
def test_graphs_fed_on_the_device_give_the_synchronous_tokens(dtype: str, model) -> None:
    sync_log, log = StepLog(moe=model == "tiny-moe"), StepLog(moe=model == "tiny-moe")
    maxes = (70, 40, 66, 9)  # contexts cross 64 tokens: a new width bucket while launched ahead
    sync_out, sync_reasons, sync_steps, sync_engine = run(False, model, maxes, device="cuda", dtype=dtype,
                                                          observer=sync_log, enable_prefix_caching=False)
    out, reasons, steps, engine = run(True, model, maxes, device="cuda", dtype=dtype, observer=log,
                                      enable_prefix_caching=False)
    graphs = engine.target.graphs
    assert graphs is not None and graphs.disabled is None and graphs.async_steps
    assert graphs.num_replays >= 60 and sync_engine.target.graphs.num_replays >= 60
    assert out == sync_out and reasons == sync_reasons and strip(steps) == strip(sync_steps)
    assert sum(a for _, _, a in steps) >= 50
    assert log.counts == sync_log.counts
    # A token some request emits first at its 21st token or later: as EOS it ends that request there.
    eos = next(t for o in sync_out for k, t in enumerate(o) if k >= 20 and t not in o[:k])
    sync_out, sync_reasons, _, _ = run(False, model, maxes, eos=eos, device="cuda", dtype=dtype)
    out, reasons, _, engine = run(True, model, maxes, eos=eos, device="cuda", dtype=dtype)
    assert "stop" in sync_reasons
    assert out == sync_out and reasons == sync_reasons and engine.kv.pool.num_in_use == 0
    # Sampled: drawn on the device from the graph's logits, keyed as the synchronous engine keys them.
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, max_tokens=40, ignore_eos=True, seed=5)
    sync_out, _, _, _ = run(False, model, maxes, device="cuda", dtype=dtype, params=params, enable_prefix_caching=False)
    out, _, steps, engine = run(True, model, maxes, device="cuda", dtype=dtype, params=params,
                                enable_prefix_caching=False)
    assert out == sync_out and sum(a for _, _, a in steps) >= 20 and engine.target.graphs.num_replays >= 20
