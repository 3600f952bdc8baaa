"""slow_features / typical_request / attribute_slow on hand-built frames. Each cause gets one slow
request among nine typical ones, so the medians are the typical request's values, and the expected
excess is worked out in the comment beside it."""
from __future__ import annotations

import pandas as pd
import pytest

from infersight.correlate.frames import REQUEST_COLUMNS
from infersight.correlate.requests import request_table
from infersight.correlate.slow_causes import (
    FEATURE_DTYPES, SLOW_COLUMNS, attribute_slow, slow_features, typical_request,
)

MS = 1_000_000
#: The typical request: queue 10 ms, prefill 20 ms for 20 tokens, decode 100 ms for 33 tokens in 32
#: clean decode steps, no stall, no network: e2e 130 ms, TTFT 30 ms.
TYPICAL = {"queue_s": 0.010, "prefill_s": 0.020, "preemption_stall_s": 0.0, "decode_s": 0.100, "network_s": 0.0,
           "prompt_tokens": 20, "cached_tokens": 0, "uncached_tokens": 20, "output_tokens": 33,
           "recompute_preemptions": 0, "swap_preemptions": 0, "recompute_s": 0.0, "reloaded_blocks": 0,
           "spec_verifications": 0, "spec_accepted": 0, "decode_clean_steps": 32, "decode_clean_s": 0.100,
           "decode_beside_prefill_steps": 0, "decode_beside_prefill_s": 0.0,
           "host_pauses": 0, "host_pause_s": 0.0, "host_pause_ttft_s": 0.0}


def feature_row(request_id: int, **changes: float) -> dict[str, float]:
    r = {"request_id": request_id, **TYPICAL, **changes}
    r["e2e_s"] = r["queue_s"] + r["prefill_s"] + r["preemption_stall_s"] + r["decode_s"] + r["network_s"]
    r["ttft_s"] = r["queue_s"] + r["prefill_s"]
    r["itl_mean_s"] = r["decode_s"] / max(1, r["output_tokens"] - 1)
    return r


def one_slow(base: dict[str, float] | None = None, **changes: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the slow request's row, the window: nine typical requests and it)."""
    base = base or {}
    window = pd.DataFrame([feature_row(i, **base) for i in range(9)] + [feature_row(99, **{**base, **changes})])
    return window[window["request_id"] == 99], window


def cause_of(slow: pd.DataFrame, window: pd.DataFrame) -> tuple[str, float, str]:
    out = attribute_slow(slow, window)
    assert list(out.columns) == SLOW_COLUMNS
    return str(out["slow_cause"].iloc[0]), float(out["excess_s"].iloc[0]), str(out["detail"].iloc[0])


SPEC = {"spec_verifications": 11, "spec_accepted": 22}  # tau 3: 33 tokens in 11 verifications
CASES = [
    # name, base of the nine, changes of the slow one, cause, excess (s)
    ("queue", {}, {"queue_s": 0.5}, "queue_wait", 0.49),
    # 200 uncached tokens >= 2 x 20; priced (200 - 20) x 1 ms/token = 0.18 = its prefill excess 0.2 - 0.02.
    ("long prompt", {}, {"prompt_tokens": 200, "uncached_tokens": 200, "prefill_s": 0.2}, "long_prompt", 0.18),
    # stall 0.3 + recompute 0.05 (inside its decode 0.15).
    ("recompute", {}, {"recompute_preemptions": 1, "preemption_stall_s": 0.3, "recompute_s": 0.05, "decode_s": 0.15},
     "preemption", 0.35),
    ("swap", {}, {"swap_preemptions": 1, "preemption_stall_s": 0.3, "reloaded_blocks": 3}, "kv_reload", 0.3),
    # 20 steps of 12 ms beside prefill against its own clean 5 ms: 0.24 - 20 x 0.005 = 0.14, under the
    # per-token decode excess 0.3 - 32 x 0.1 / 32 = 0.2.
    ("interference", {}, {"decode_s": 0.3, "decode_clean_steps": 12, "decode_clean_s": 0.06,
                          "decode_beside_prefill_steps": 20, "decode_beside_prefill_s": 0.24},
     "batch_interference", 0.14),
    # tau 33 / 30 = 1.1 against 3: 0.3 x (1 - 1.1 / 3) = 0.19, under the per-token excess 0.2.
    ("speculation", SPEC, {"decode_s": 0.3, "spec_verifications": 30, "spec_accepted": 3},
     "speculation_rejections", 0.19),
    # 200 tokens at the typical 3.125 ms/token: decode 0.621875 - 0.1.
    ("long output", {}, {"output_tokens": 200, "decode_s": 0.621875, "decode_clean_steps": 199,
                         "decode_clean_s": 0.621875}, "long_output", 0.521875),
    ("network", {}, {"network_s": 0.4}, "network", 0.4),
    # Two collections of 0.15 s while it decoded: its decode 0.4 s, e2e +0.3 s; the pauses explain 0.3.
    ("host pause", {}, {"decode_s": 0.4, "host_pauses": 2, "host_pause_s": 0.3}, "host_pause", 0.3),
    # A collection of 0.14 s inside its steps beside prefill chunks (20 of 12 ms, as in "interference"): the
    # interference figure (0.14) holds the pause and no more, and the pause, measured as such, is named.
    ("pause beside prefill", {}, {"decode_s": 0.3, "decode_clean_steps": 12, "decode_clean_s": 0.06,
                                  "decode_beside_prefill_steps": 20, "decode_beside_prefill_s": 0.24,
                                  "host_pauses": 1, "host_pause_s": 0.14}, "host_pause", 0.14),
]


@pytest.mark.parametrize("name,base,changes,cause,excess", CASES, ids=[c[0] for c in CASES])
def test_each_cause_is_the_largest_excess(name: str, base: dict, changes: dict, cause: str, excess: float) -> None:
    slow, window = one_slow(base, **changes)
    got, amount, detail = cause_of(slow, window)
    assert (got, amount) == (cause, pytest.approx(excess)), detail
    assert f"{excess:.3f} s of its" in detail


def test_typical_request_is_the_window_median() -> None:
    _, window = one_slow(SPEC, queue_s=9.0)
    typ = typical_request(window)
    assert typ["queue_s"] == 0.010 and typ["e2e_s"] == pytest.approx(0.130) and typ["tau"] == 3.0
    assert typ["prefill_s_per_token"] == pytest.approx(0.001) and typ["decode_s_per_token"] == pytest.approx(0.1 / 32)
    assert typ["decode_step_s"] == pytest.approx(0.1 / 32)


def test_what_no_cause_explains_is_unattributed() -> None:
    # Decode 0.2 s slower with typical length, no interference, no speculation: nothing to blame.
    assert cause_of(*one_slow(decode_s=0.3))[0] == "unattributed"
    # A slow prefill of a prompt that is long but mostly cached (8 uncached tokens) is not long_prompt.
    assert cause_of(*one_slow(prompt_tokens=200, cached_tokens=192, uncached_tokens=8, prefill_s=0.2))[0] == "unattributed"
    # A cause that explains under a quarter of the excess: queue +0.04 of +0.34 (the rest unexplained decode).
    assert cause_of(*one_slow(queue_s=0.05, decode_s=0.4))[0] == "unattributed"


def test_an_unattributed_request_says_which_part_its_time_is_in() -> None:
    # A long output (66 tokens: decode 0.2 s, +0.1 over typical) that also stalled 0.35 s in its
    # prefill (a host pause): the output explains 0.1 of +0.45 s, under a quarter, and the detail
    # points at the prefill: 0.37 - 0.02.
    cause, amount, detail = cause_of(*one_slow(output_tokens=66, decode_s=0.2, prefill_s=0.37))
    assert (cause, amount) == ("unattributed", pytest.approx(0.1))
    assert detail == ("no cause explains its +0.450 s over the typical e2e (largest: long output, 0.100 s); "
                      "its prefill took +0.350 s over the typical request's")
    # Judged on ITL, only its decode and stalls count: the decode, +0.1 s.
    slow, window = one_slow(decode_s=0.2)
    assert cause_of(slow.assign(metric="itl"), window)[2].endswith("its decode took +0.100 s over the typical request's")
    # On TTFT, a prefill of a typical prompt 0.18 s slow, beside a decode 0.5 s slow that TTFT holds none of.
    slow, window = one_slow(prefill_s=0.2, decode_s=0.6)
    _, _, detail = cause_of(slow.assign(metric="ttft"), window)
    assert detail.endswith("its prefill took +0.180 s over the typical request's"), detail


def test_the_judged_metric_picks_the_candidates() -> None:
    slow, window = one_slow(queue_s=0.5, swap_preemptions=1, preemption_stall_s=0.3)
    assert cause_of(slow, window)[0] == "queue_wait"                      # e2e: the larger excess
    assert cause_of(slow.assign(metric="itl"), window)[0] == "kv_reload"  # ITL: queueing is not in it
    slow, window = one_slow(queue_s=0.2, decode_s=0.3, decode_clean_steps=12, decode_clean_s=0.06,
                            decode_beside_prefill_steps=20, decode_beside_prefill_s=0.24)
    assert cause_of(slow.assign(metric="ttft"), window)[0] == "queue_wait"  # TTFT: decode is not in it


def test_the_judged_metric_picks_which_pauses_count() -> None:
    # 0.25 s of pauses, 0.05 s of them before the first token (inside its prefill, 0.07 s).
    slow, window = one_slow(prefill_s=0.07, decode_s=0.3, host_pauses=3, host_pause_s=0.25, host_pause_ttft_s=0.05)
    assert cause_of(slow, window)[:2] == ("host_pause", pytest.approx(0.25))
    assert cause_of(slow.assign(metric="ttft"), window)[:2] == ("host_pause", pytest.approx(0.05))
    cause, amount, detail = cause_of(slow.assign(metric="itl"), window)
    assert (cause, amount) == ("host_pause", pytest.approx(0.2))
    assert detail.startswith("its engine's process stood still 0.200 s in garbage collections after its first token "
                             "(3 while it was in flight; typical 0.000 s)"), detail
    # Pauses every request had are typical: 0.1 s each, this one 0.1 s too, nothing stands out.
    slow, window = one_slow({"host_pauses": 1, "host_pause_s": 0.1}, decode_s=0.4)
    assert cause_of(slow, window)[0] == "unattributed"


def test_an_overloaded_window_measures_queueing_from_zero() -> None:
    # Everyone queues 1 s, so this request (like all) is typical and nothing stands out; under an e2e
    # SLO of 0.5 s the typical request is itself over it, and the queue is measured from zero.
    slow, window = one_slow({"queue_s": 1.0})
    assert cause_of(slow, window)[0] == "unattributed"
    cause, amount, _ = cause_of(slow.assign(metric="e2e", threshold_s=0.5), window)
    assert (cause, amount) == ("queue_wait", pytest.approx(1.0))


def test_no_slow_requests() -> None:
    out = attribute_slow(one_slow()[0].iloc[0:0], one_slow()[1])
    assert out.empty and list(out.columns) == SLOW_COLUMNS


def events(rows: list[tuple]) -> pd.DataFrame:
    """rows: (ts_ms, end_ms, request_id, event, value0, value1, reason)."""
    return pd.DataFrame({
        "ts_ns": [r[0] * MS for r in rows], "end_ns": [r[1] * MS for r in rows], "request_id": [r[2] for r in rows],
        "trace_id": [f"{r[2]:032x}" for r in rows], "task": ["chat"] * len(rows), "event": [r[3] for r in rows],
        "reason": [r[6] for r in rows], "value0": [r[4] for r in rows],
        "value1": [r[5] for r in rows]}).astype(REQUEST_COLUMNS)


def test_slow_features_from_events_steps_and_batch() -> None:
    # r1: first token at 20, preempted (recompute) at 40, resumed and re-prefilled in step 5 [60, 70).
    # r2: 4 of its prompt tokens cached; first token at 20, preempted by swap at 50, back at 60.
    ev = events([
        (0, 0, 1, "ARRIVED", 10, 0, ""), (10, 0, 1, "SCHEDULED", 10, 0, ""), (10, 20, 1, "PREFILL_CHUNK", 10, 0, ""),
        (20, 0, 1, "FIRST_TOKEN", 0, 0, ""), (40, 0, 1, "PREEMPTED", 0, 0, "recompute"), (60, 0, 1, "RESUMED", 0, 0, ""),
        (60, 70, 1, "PREFILL_CHUNK", 12, 0, ""), (100, 0, 1, "FINISHED", 5, 0, "length"),
        (0, 0, 2, "ARRIVED", 10, 0, ""), (10, 0, 2, "SCHEDULED", 10, 4, ""), (10, 20, 2, "PREFILL_CHUNK", 6, 4, ""),
        (20, 0, 2, "FIRST_TOKEN", 0, 0, ""), (50, 0, 2, "PREEMPTED", 0, 0, "swap"), (60, 0, 2, "RESUMED", 0, 0, ""),
        (100, 0, 2, "FINISHED", 5, 0, "length"),
    ])
    steps = pd.DataFrame({"step_id": [1, 2, 3, 4, 5, 6], "start_ns": [10 * MS, 20 * MS, 30 * MS, 40 * MS, 60 * MS, 70 * MS],
                          "end_ns": [20 * MS, 30 * MS, 40 * MS, 50 * MS, 70 * MS, 85 * MS],
                          "prefill_tokens": [16, 0, 0, 0, 12, 0]})
    batch = pd.DataFrame({"step_id": [1, 1, 2, 2, 3, 3, 4, 5, 5, 6, 6], "request_id": [1, 2, 1, 2, 1, 2, 2, 1, 2, 1, 2],
                          "num_tokens": [10, 6, 1, 1, 1, 1, 1, 12, 1, 1, 1]})
    spec = pd.DataFrame({"request_id": [1, 1, 1, 2], "proposed": [3, 3, 0, 2], "accepted": [1, 2, 0, 0]})
    kv = pd.DataFrame({"ts_ns": [1, 2, 3], "event": ["reloaded", "reloaded", "allocated"], "block_id": [1, 2, 3],
                       "request_id": [2, 2, 1], "block_hash": [0, 0, 0]})
    rows = request_table(ev)
    f = slow_features(rows, ev, steps, batch, spec, kv).set_index("request_id")
    assert set(FEATURE_DTYPES) <= set(f.columns)
    assert list(f["uncached_tokens"]) == [10, 6]
    assert list(f["recompute_preemptions"]) == [1, 0] and list(f["swap_preemptions"]) == [0, 1]
    assert list(f["recompute_s"]) == pytest.approx([0.010, 0.0])   # r1's chunk after its recompute
    assert list(f["reloaded_blocks"]) == [0, 2]
    assert list(f["spec_verifications"]) == [2, 1] and list(f["spec_accepted"]) == [3, 0]
    # r1 decodes in steps 2, 3, 6 (step 5 is its own re-prefill; step 4 it sat out): all clean, 10+10+15 ms.
    # r2 decodes in 2, 3, 4, 6 clean (10+10+10+15 ms) and in 5 beside r1's 12 prefill tokens (10 ms).
    assert list(f["decode_clean_steps"]) == [3, 4] and list(f["decode_clean_s"]) == pytest.approx([0.035, 0.045])
    assert list(f["decode_beside_prefill_steps"]) == [0, 1]
    assert list(f["decode_beside_prefill_s"]) == pytest.approx([0.0, 0.010])
    # Without steps and batch rows the step columns are 0; the inputs are unchanged throughout.
    bare = slow_features(rows, ev)
    assert (bare["decode_clean_steps"] == 0).all() and (bare["spec_verifications"] == 0).all()
    assert (bare["host_pauses"] == 0).all() and (bare["host_pause_s"] == 0).all()
    pd.testing.assert_frame_equal(rows, request_table(ev))


def pauses(spans_ms: list[tuple[float, float]], ring: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"ts_ns": [round(a * MS) for a, _ in spans_ms], "end_ns": [round(b * MS) for _, b in spans_ms],
                         "collected": 0, "missed": 0, "generation": 2, "ring_index": ring})


def test_a_requests_pauses_are_those_inside_its_life() -> None:
    # r1 arrives at 0, first token at 20, finishes at 100; r2 (ring 1: its id carries the index above
    # bit 48) lives over the same times on another engine. Pauses of r1's engine: [-10, 5) (5 ms inside),
    # [15, 25) (5 before the first token, 5 after), [50, 60), [95, 130) (5 inside), [140, 150) (after it).
    r2 = (1 << 48) + 2
    ev = events([(0, 0, rid, e, 10, 0, "") for rid in (1, r2) for e in ("ARRIVED", "SCHEDULED")]
                + [(20, 0, rid, "FIRST_TOKEN", 0, 0, "") for rid in (1, r2)]
                + [(100, 0, rid, "FINISHED", 5, 0, "length") for rid in (1, r2)])
    rows = request_table(ev)
    mine = pauses([(95, 130), (-10, 5), (15, 25), (140, 150), (50, 60)])  # not in time order
    other = pauses([(30, 31)], ring=1)
    f = slow_features(rows, ev, host_pauses=pd.concat([mine, other], ignore_index=True)).set_index("request_id")
    assert f.loc[1, "host_pauses"] == 4 and f.loc[r2, "host_pauses"] == 1
    assert f.loc[1, "host_pause_s"] == pytest.approx((5 + 10 + 10 + 5) / 1e3)
    assert f.loc[1, "host_pause_ttft_s"] == pytest.approx((5 + 5) / 1e3)
    assert (f.loc[r2, "host_pause_s"], f.loc[r2, "host_pause_ttft_s"]) == (pytest.approx(0.001), 0.0)
    # Records a producer got wrong (overlapping) are merged, never counted twice: [15, 25) and [20, 40).
    f = slow_features(rows, ev, host_pauses=pauses([(15, 25), (20, 40)])).set_index("request_id")
    assert f.loc[1, "host_pause_s"] == pytest.approx(0.025) and f.loc[1, "host_pause_ttft_s"] == pytest.approx(0.005)
