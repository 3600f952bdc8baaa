"""spec_speedup: the step costs, the join of verifications to steps, and the speedup per task, on
tiny hand-built frames whose expected values are worked out by hand in the comments."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.frames import SPEC_COLUMNS, STEP_TIMING_COLUMNS
from infersight.correlate.spec_speedup import (
    ENGINE_ID_SHIFT, MODEL_ERROR, MODEL_ERROR_CUDA, NO_PROBES, NO_TIMING, PREDICTED, join_steps, model_error,
    speedup_by_task, step_costs, summary_by_task,
)

E1 = 1 << ENGINE_ID_SHIFT  # ids of a second engine, as the agent offsets them


def _steps(rows: list[tuple]) -> pd.DataFrame:
    """rows: (step_id, start_ns, duration, draft_ns, target_ns, decode_requests, prefill_tokens, probe[,
    (launched_ahead, launched_next)]); synchronous steps where the last is left out."""
    return pd.DataFrame([{
        "step_id": sid, "start_ns": start, "end_ns": start + dur, "schedule_ns": 1, "draft_ns": draft,
        "target_ns": target, "decode_requests": b, "prefill_tokens": prefill, "spec_tokens": 0 if probe else 4 * b,
        "spec_accepted": 0, "draft_forwards": 0 if probe else 4, "spec_probe": probe, "graph_captures": 0,
        "profiled": False, "kv_moves": 0, "launched_ahead": flags[0], "launched_next": flags[1]}
        for sid, start, dur, draft, target, b, prefill, probe, *rest in rows
        for flags in [rest[0] if rest else (False, False)]]).astype(STEP_TIMING_COLUMNS)


def _spec(rows: list[tuple]) -> pd.DataFrame:
    """rows: (ts_ns, request_id, task, accepted); 4 proposed each."""
    return pd.DataFrame([{"ts_ns": ts, "request_id": rid, "task": task, "proposed": 4, "accepted": acc,
                          "accept_mask": np.uint64((1 << acc) - 1), "draft_ns": 0, "verify_ns": 0}
                         for ts, rid, task, acc in rows]).astype(SPEC_COLUMNS)


# Batch size 2. Probe steps: 100, 120, 110 ns (median Tp = 110), target 90, 100, 95 (median 95).
# Speculative steps: 300, 320, 310 (median Ts = 310), draft 160 (4 forwards: 40 each), target 120;
# step less draft 140, 160, 150 -> median 150, so the verify extra X = 150 - 110 = 40.
STEPS = _steps([
    (1, 0, 100, 0, 90, 2, 0, True), (2, 1000, 300, 160, 120, 2, 0, False), (3, 2000, 120, 0, 100, 2, 0, True),
    (4, 3000, 320, 160, 120, 2, 0, False), (5, 4000, 110, 0, 95, 2, 0, True), (6, 5000, 310, 160, 120, 2, 0, False),
])
# code: accepted 3, 1, 2, 2 in steps 2 and 4 (tokens 4, 2, 3, 3: tau 3); qa: 0, 0 in step 6 (tau 1).
SPEC = _spec([(1100, 1, "code", 3), (1200, 2, "code", 1), (3100, 1, "code", 2), (3200, 2, "code", 2),
              (5100, 3, "qa", 0), (5200, 4, "qa", 0)])


def test_step_costs_are_medians_per_batch_size() -> None:
    c = step_costs(STEPS)
    assert len(c) == 1
    row = c.iloc[0]
    assert (row.engine, row.batch, row.probe_steps, row.plain_samples, row.spec_steps) == (0, 2, 3, 3, 3)
    assert [row.plain_step_ns, row.plain_forward_ns, row.spec_step_ns, row.draft_ns_per_forward, row.verify_ns,
            row.verify_extra_ns] == [110, 95, 310, 40, 120, 40]
    assert row.plain_rel_mad == pytest.approx(10 / 110) and row.spec_rel_mad == pytest.approx(10 / 310)


def test_an_async_engine_prices_the_plain_step_by_the_steady_steps_of_its_probe_runs() -> None:
    # Engine 1 ran two probe runs of 4 at batch 2 under async scheduling: the first step of each run
    # synchronous (190, 200 ns: launch and read in one interval), the last launched ahead but launching
    # nothing (70, 80: a read alone); the middle ones launched ahead and launching ahead: 100, 104, 106, 140.
    # Engine 0 (STEPS: synchronous probes 100, 120, 110) keeps every probe.
    e1 = [(E1 + 1, 0, 190, 0, 90, 2, 0, True, (False, True)), (E1 + 2, 200, 100, 0, 90, 2, 0, True, (True, True)),
          (E1 + 3, 300, 104, 0, 90, 2, 0, True, (True, True)), (E1 + 4, 400, 70, 0, 90, 2, 0, True, (True, False)),
          (E1 + 5, 500, 300, 160, 120, 2, 0, False),
          (E1 + 6, 800, 200, 0, 90, 2, 0, True, (False, True)), (E1 + 7, 1000, 106, 0, 90, 2, 0, True, (True, True)),
          (E1 + 8, 1100, 140, 0, 90, 2, 0, True, (True, True)), (E1 + 9, 1300, 80, 0, 90, 2, 0, True, (True, False)),
          (E1 + 10, 1400, 320, 160, 120, 2, 0, False)]
    c = step_costs(pd.concat([STEPS, _steps(e1)], ignore_index=True)).set_index("engine")
    # All 8 probes took a speculative step's place (probe_steps: the displacement); 4 price the plain step.
    assert (c.loc[1, "probe_steps"], c.loc[1, "plain_samples"], c.loc[1, "plain_step_ns"]) == (8, 4, (104 + 106) / 2)
    assert (c.loc[0, "probe_steps"], c.loc[0, "plain_samples"], c.loc[0, "plain_step_ns"]) == (3, 3, 110)
    assert c.loc[1, "verify_extra_ns"] == (140 + 160) / 2 - 105


def test_an_async_engines_prediction_says_which_probes_priced_it() -> None:
    e1 = [(E1 + 1, 0, 190, 0, 90, 2, 0, True, (False, True)), (E1 + 2, 200, 100, 0, 90, 2, 0, True, (True, True)),
          (E1 + 3, 300, 110, 0, 90, 2, 0, True, (True, True)), (E1 + 4, 400, 70, 0, 90, 2, 0, True, (True, False)),
          (E1 + 5, 500, 300, 160, 120, 2, 0, False)]
    spec = _spec([(600, E1 + 1, "code", 3), (700, E1 + 2, "code", 1)])
    code = speedup_by_task(spec, _steps(e1)).set_index("task").loc["code"]
    assert (code.probe_steps, code.plain_samples, code.plain_step_ms) == (4, 2, pytest.approx(105e-6))
    # tau = (4 + 2) / 2 = 3 tokens a verification against one a plain step: 3 x 105 / 300
    assert code.predicted_speedup == pytest.approx(3 * 105 / 300)
    how = summary_by_task(speedup_by_task(spec, _steps(e1)))["code"]["how"]
    assert how.startswith("predicted, not measured: estimated from 2 steady async plain probe steps (of 4:")


def test_pure_decode_speedup_is_tau_times_plain_over_spec_step() -> None:
    t = speedup_by_task(SPEC, STEPS).set_index("task")
    code, qa = t.loc["code"], t.loc["qa"]
    assert code.basis == PREDICTED and code.timed_verifications == 4 and code.mixed_verifications == 0
    # (tau / Ts) / (1 / Tp) = 3 * 110 / 310
    assert code.predicted_speedup == pytest.approx(330 / 310)
    assert qa.predicted_speedup == pytest.approx(110 / 310)
    assert [code.spec_step_ms, code.plain_step_ms, code.draft_ms_per_token, code.verify_ms, code.plain_forward_ms,
            code.verify_extra_ms] == pytest.approx([310e-6, 110e-6, 40e-6, 120e-6, 95e-6, 40e-6])
    # model: tau / (gamma c + 1), c = 40 / 95, gamma 4
    assert code.model_speedup == pytest.approx(3 / (4 * 40 / 95 + 1))
    # interval: exp(+-2 sigma), sigma from the median's error of both step kinds (3 samples each), tau's,
    # and the model's
    se = 1.2533 * 1.4826 / math.sqrt(3)
    sigma = math.sqrt((se * 10 / 110) ** 2 + (se * 10 / 310) ** 2 + (np.std([4, 2, 3, 3], ddof=1) / 2 / 3) ** 2
                      + MODEL_ERROR ** 2)
    assert [code.speedup_low, code.speedup_high] == pytest.approx(
        [330 / 310 * math.exp(-2 * sigma), 330 / 310 * math.exp(2 * sigma)])
    assert (code.probe_steps, code.spec_steps, code.mean_batch) == (3, 2, 2.0)  # verified in steps 2 and 4
    assert code.model_error == MODEL_ERROR


def test_an_engine_on_a_gpu_gets_the_cuda_model_error_in_its_interval() -> None:
    cpu = speedup_by_task(SPEC, STEPS).set_index("task").loc["code"]
    cuda = speedup_by_task(SPEC, STEPS, model_error(on_gpu=True)).set_index("task").loc["code"]
    assert cuda.predicted_speedup == cpu.predicted_speedup and cuda.model_error == MODEL_ERROR_CUDA
    # The same sampling terms, the model term swapped: sigma^2 grows by MODEL_ERROR_CUDA^2 - MODEL_ERROR^2.
    sigma = math.log(cpu.speedup_high / cpu.predicted_speedup) / 2
    wider = math.sqrt(sigma ** 2 - MODEL_ERROR ** 2 + MODEL_ERROR_CUDA ** 2)
    assert cuda.speedup_high == pytest.approx(cuda.predicted_speedup * math.exp(2 * wider))
    assert summary_by_task(speedup_by_task(SPEC, STEPS, MODEL_ERROR_CUDA))["code"]["how"].count("(CUDA runs)") == 1


def test_a_mixed_step_counts_once_on_both_sides() -> None:
    # Step 7 ran a 50-token prefill chunk beside two decodes: 500 ns, 200 of them drafting.
    steps = pd.concat([STEPS, _steps([(7, 6000, 500, 200, 300, 2, 50, False)])], ignore_index=True)
    spec = pd.concat([SPEC, _spec([(6100, 1, "code", 3)])], ignore_index=True)
    code = speedup_by_task(spec, steps).set_index("task").loc["code"]
    assert code.mixed_verifications == 1
    # Without its 3 probe steps the engine would have run 3 + 3 speculative steps at batch 2, so the
    # 4 pure-decode verifications count twice (w = 1 + 3 / 3); the mixed step once.
    # plain: 2 x 12 tokens x 110 + 4 x 110 + (max(500 - 200 - 40, 110) - 110); spec: 2 x 4 x 310 + 500
    assert code.predicted_speedup == pytest.approx((2 * 12 * 110 + 4 * 110 + 150) / (2 * 4 * 310 + 500))
    # the mixed step is no pure-decode sample: the medians are unchanged
    assert code.spec_step_ms == pytest.approx(310e-6)


def test_a_mixed_step_is_priced_by_the_plain_mixed_probes_where_there_are_some() -> None:
    # The same mixed step 7 (500 ns, 200 drafting, 50 prefill tokens beside 2 decodes), and three
    # plain mixed probe steps at batch 2: 400 ns with 50 prefill tokens, 500 with 100, 600 with 150,
    # so M(P, 2) = 300 + 2 P exactly: M(50, 2) = 400 (not max(500 - 200 - 40, 110) = 260).
    steps = pd.concat([STEPS, _steps([(7, 6000, 500, 200, 300, 2, 50, False), (8, 7000, 400, 0, 380, 2, 50, True),
                                      (9, 8000, 500, 0, 480, 2, 100, True), (10, 9000, 600, 0, 580, 2, 150, True)])],
                      ignore_index=True)
    spec = pd.concat([SPEC, _spec([(6100, 1, "code", 3)])], ignore_index=True)
    code = speedup_by_task(spec, steps).set_index("task").loc["code"]
    assert (code.mixed_verifications, code.mixed_probe_steps) == (1, 3)
    # Pure part as above (w = 2). The 3 mixed probes took the place of speculative mixed steps beside
    # the 1 seen: wm = 1 + 3 / 1 = 4 on both sides. plain: 4 x (3 tokens x 110 + 400); spec: 4 x 500.
    assert code.predicted_speedup == pytest.approx((2 * 12 * 110 + 4 * (3 * 110 + 400)) / (2 * 4 * 310 + 4 * 500))
    # Under open arrivals the plain request meets prefills in proportion to its lifetime: A = 2 x 12 x 110 +
    # 4 x 4 tokens x 110 = 4400 without what they add, M = 4 x (400 - 110) = 1160 they add, S = 4480:
    # P = A / (1 - M / S). (Its batch, 2 x P / S, reads Tp at 110 still: batch 2 is the only one probed.) The
    # interval spans both.
    a, m, s = 2 * 12 * 110 + 4 * 4 * 110, 4 * (400 - 110), 2 * 4 * 310 + 4 * 500
    assert code.open_arrivals_speedup == pytest.approx(a / (1 - m / s) / s)
    assert code.speedup_low * code.speedup_high == pytest.approx(code.open_arrivals_speedup * code.predicted_speedup)
    assert code.plain_mixed_ms == pytest.approx(400e-6)
    # the pure-decode medians are the pure steps' alone
    assert (code.plain_step_ms, code.spec_step_ms) == pytest.approx((110e-6, 310e-6))
    how = summary_by_task(speedup_by_task(spec, steps))["code"]["how"]
    assert "a plain mixed step fitted on 3 plain mixed probe steps" in how


def test_plain_step_time_is_interpolated_between_probed_batch_sizes() -> None:
    steps = _steps([(1, 0, 100, 0, 90, 2, 0, True), (2, 1000, 200, 0, 180, 4, 0, True),
                    (3, 2000, 450, 200, 200, 3, 0, False)])
    spec = _spec([(2100, 1, "code", 2), (2200, 2, "code", 2), (2300, 3, "code", 2)])
    code = speedup_by_task(spec, steps).set_index("task").loc["code"]
    # Tp(3) = 150 (halfway between 100 at 2 and 200 at 4); tau 3; Ts 450
    assert code.plain_step_ms == pytest.approx(150e-6)
    assert code.predicted_speedup == pytest.approx(3 * 150 / 450)
    assert code.probe_steps == 0  # no probe at exactly 3: the figure leans on its neighbours


def test_under_open_arrivals_the_plain_engine_runs_at_its_own_batch() -> None:
    """Probes: 100 ns at batch 1, 200 at 2 (three each); speculative steps at 2: 300 ns (three), one
    verification each with nothing accepted (1 token): speculation loses. Closed loop: w = 1 + 3 / 3 = 2,
    plain 2 x 3 x 200 = 1200, spec 2 x 3 x 300 = 1800: 2/3. Open arrivals, by Little's law the plain engine
    holds requests for P / S of the time, so it decodes at batch 2 x P / S: 2 (P 1200), 4/3 (Tp 133.3, P 800),
    8/9 -> 1 (Tp 100, P 600), 2/3 -> 1 (P 600): 600 / 1800 = 1/3."""
    steps = _steps([(1, 0, 100, 0, 90, 1, 0, True), (2, 1000, 100, 0, 90, 1, 0, True), (3, 2000, 100, 0, 90, 1, 0, True),
                    (4, 3000, 200, 0, 190, 2, 0, True), (5, 4000, 300, 160, 120, 2, 0, False),
                    (6, 5000, 200, 0, 190, 2, 0, True), (7, 6000, 300, 160, 120, 2, 0, False),
                    (8, 7000, 200, 0, 190, 2, 0, True), (9, 8000, 300, 160, 120, 2, 0, False)])
    spec = _spec([(4100, 1, "chat", 0), (6100, 1, "chat", 0), (8100, 1, "chat", 0)])
    chat = speedup_by_task(spec, steps).set_index("task").loc["chat"]
    assert chat.predicted_speedup == pytest.approx(1200 / 1800)
    assert chat.open_arrivals_speedup == pytest.approx(600 / 1800)
    assert chat.speedup_low < 600 / 1800 < 1200 / 1800 < chat.speedup_high
    assert chat.speedup_low * chat.speedup_high == pytest.approx(600 / 1800 * 1200 / 1800)


def test_join_keeps_engines_apart_and_drops_what_no_step_holds() -> None:
    # Engine 1 runs at the same time as engine 0 with slower steps.
    other = _steps([(E1 + 1, 0, 200, 0, 190, 2, 0, True), (E1 + 2, 1000, 900, 400, 300, 2, 0, False)])
    steps = pd.concat([STEPS, other], ignore_index=True)
    spec = pd.concat([SPEC, _spec([(1150, E1 + 7, "code", 0), (9999, 5, "code", 1)])], ignore_index=True)
    j = join_steps(spec, steps)
    assert len(j) == 7  # ts 9999 falls in no step
    assert j.set_index("request_id").loc[E1 + 7, "dur_ns"] == 900
    assert set(j.loc[j["request_id"] < E1, "dur_ns"]) == {300, 320, 310}
    t = speedup_by_task(spec, steps).set_index("task")
    # code: engine 0 tokens 4 + 2 + 3 + 3 at Tp 110 / Ts 310; engine 1 one token at Tp 200 / Ts 900
    assert t.loc["code", "predicted_speedup"] == pytest.approx((12 * 110 + 1 * 200) / (4 * 310 + 900) * 1.0)
    assert t.loc["code", "verifications"] == 6 and t.loc["code", "timed_verifications"] == 5


@pytest.mark.parametrize("mark, unmarked", [
    # A capture (seconds' order on CUDA) lands on the first plain step at a batch size: a probe.
    ({"graph_captures": [1, 2]}, {"graph_captures": 0}),
    # A capture window runs its steps eagerly under torch.profiler: a plain CUDA step takes an eager
    # forward's time there, not a graph replay's.
    ({"profiled": [True, True]}, {"profiled": False}),
    # A step whose schedule preempted or swapped in requests spent its time moving KV (the H200
    # demo's ~1 ms plain steps took ~30 ms so).
    ({"kv_moves": [1, 3]}, {"kv_moves": 0}),
])
def test_steps_that_are_no_sample_of_the_steady_step_time_are_left_out(mark: dict, unmarked: dict) -> None:
    """Left in, the marked 5,000 ns probe would be the plain median; left out, the figures are those
    of the steps without them."""
    marked = _steps([(7, 6000, 5000, 0, 4900, 2, 0, True), (8, 7000, 9000, 160, 120, 2, 0, False)]).assign(**mark)
    steps = pd.concat([STEPS, marked], ignore_index=True)
    pd.testing.assert_frame_equal(step_costs(steps), step_costs(STEPS))
    pd.testing.assert_frame_equal(speedup_by_task(SPEC, steps), speedup_by_task(SPEC, STEPS))
    # ... while without the mark the 5,000 ns probe would move the plain median (110 -> 115).
    assert step_costs(pd.concat([STEPS, marked.assign(**unmarked)])).iloc[0].plain_step_ns == 115


def test_a_batch_size_whose_speculative_steps_all_moved_kv_is_still_predicted() -> None:
    """At batch 4 one steady probe step (200 ns) and one speculative step that moved KV (left out of the
    medians, so no speculative sample at 4: Ts(4) is batch 2's 310, the nearest). Its verification (task long,
    3 accepted: 4 tokens) counts once, Ts scaled to the speed around it (the speculative steps the nearest
    probes span, 4 and 6: 320 and 310 against 310, median 315 / 310): 4 x 200 / 315. Before, 1 + probes / 0
    made every task NaN."""
    extra = pd.concat([_steps([(7, 6000, 200, 0, 190, 4, 0, True)]),
                       _steps([(8, 7000, 400, 160, 120, 4, 0, False)]).assign(kv_moves=1)], ignore_index=True)
    t = speedup_by_task(pd.concat([SPEC, _spec([(7100, 5, "long", 3)])], ignore_index=True),
                        pd.concat([STEPS, extra], ignore_index=True)).set_index("task")
    assert t.at["long", "predicted_speedup"] == pytest.approx(4 * 200 / 315)
    assert t.at["code", "predicted_speedup"] == pytest.approx(330 / 310)  # unchanged


def test_without_probes_or_timings_nothing_is_predicted() -> None:
    no_probes = speedup_by_task(SPEC, STEPS[~STEPS["spec_probe"]]).set_index("task")
    assert set(no_probes["basis"]) == {NO_PROBES} and no_probes["predicted_speedup"].isna().all()
    no_timing = speedup_by_task(SPEC, STEPS.iloc[:0])
    assert set(no_timing["basis"]) == {NO_TIMING} and no_timing["model_speedup"].isna().all()
    assert list(no_timing["mean_accepted_length"]) == [3.0, 1.0]  # acceptance is still there
    assert speedup_by_task(SPEC.iloc[:0], STEPS).empty


def test_summary_says_how_each_figure_was_obtained() -> None:
    s = summary_by_task(speedup_by_task(SPEC, STEPS))
    code = s["code"]
    assert code["basis"] == PREDICTED and code["how"].startswith("predicted, not measured: estimated from 3 plain probe steps")
    assert "3.00 tokens per verification (mean of 4)" in code["how"]
    # one batch size probed: a plain engine's own batch reads the same Tp, so both figures are 330 / 310
    assert "spanning the figure for a closed loop (1.06x) and for open arrivals (1.06x" in code["how"]
    assert code["open_arrivals_speedup"] == pytest.approx(330 / 310)
    assert code["samples"] == {"verifications": 4, "timed_verifications": 4, "mixed_verifications": 0,
                               "spec_steps": 2, "probe_steps": 3, "plain_samples": 3, "mixed_probe_steps": 0}
    assert code["parts_ms"]["plain_step"] == pytest.approx(110e-6)
    assert code["model_speedup"] == pytest.approx(3 / (4 * 40 / 95 + 1)) and code["model"].startswith("tau /")
    assert summary_by_task(speedup_by_task(SPEC, STEPS.iloc[:0]))["qa"]["how"].startswith("not predicted")


def test_inputs_are_not_changed() -> None:
    spec, steps = SPEC.copy(deep=True), STEPS.copy(deep=True)
    speedup_by_task(SPEC, STEPS)
    pd.testing.assert_frame_equal(SPEC, spec)
    pd.testing.assert_frame_equal(STEPS, steps)


def test_steps_are_compared_with_probes_of_their_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine halves its speed for plain steps halfway: each task is judged on its own span."""
    monkeypatch.setattr("infersight.correlate.spec_step_costs.LOCAL_PROBES", 2)
    rows, spec = [], []
    for i in range(8):  # a probe, then 500 ns later a speculative step; the probes slow down after 4
        rows += [(2 * i + 1, 2000 * i, 100 if i < 4 else 200, 0, 90, 2, 0, True),
                 (2 * i + 2, 2000 * i + 500, 300, 100, 150, 2, 0, False)]
        spec += [(2000 * i + 600, 1, "code" if i < 4 else "qa", 2), (2000 * i + 700, 2, "code" if i < 4 else "qa", 2)]
    t = speedup_by_task(_spec(spec), _steps(rows)).set_index("task")
    # tau 3 against the local plain step; the global median (150) would give 1.5 for both. Step i
    # is nearest to probe i, whose speed is the median over the centred window of 2 probes, i-1
    # and i: 100/150 of the median for code's four steps; for qa's, 1 (probes 3 and 4), then 200/150.
    assert t.loc["code", "predicted_speedup"] == pytest.approx(3 * 100 / 300)
    assert t.loc["qa", "predicted_speedup"] == pytest.approx(3 * (150 + 3 * 200) / (4 * 300))
