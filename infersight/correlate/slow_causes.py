"""Why a slow request was slow: the part of it that exceeds the typical request the most.

slow_features() adds to request_table() rows what the causes are measured on (FEATURE_DTYPES);
typical_request() takes medians over a window of such rows (slow_rule.judge_slow's window of recent
finished requests); attribute_slow() names, for each slow request, the cause whose excess over the
typical request is largest, in seconds:

  host_pause              the engine process's garbage-collection pauses while it was in flight (arrival to
                          finish; under a TTFT SLO those before its first token, under an ITL SLO those after)
                          - the typical request's: measured by the collector's own callbacks, so where
                          another cause's figure holds the same pause (a step made long by it) and no more,
                          the pause is named
  queue_wait              queue_s - typical queue_s
  long_prompt             only for a prompt far longer than typical (uncached tokens >= 2x the median and
                          LONG_PROMPT_EXTRA_TOKENS more):
                          its prefill excess (prefill_s - typical), at most the extra tokens priced at the
                          typical prefill seconds per token
  preemption              preempted with recompute: stall + the re-prefill after it (recompute_s) - typical stall
  kv_reload               preempted by swap only: its stall (waiting for its KV to come back from the CPU
                          tier) - typical stall
  batch_interference      its decode steps that ran beside other requests' prefill chunks, each minus its own
                          clean decode step (the typical clean step when it had none)
  speculation_rejections  decode time lost to fewer tokens per verification (tau) than typical:
                          decode_s * (1 - tau / typical tau)
  long_output             only for an output far longer than typical (>= 2x the median): decode_s - typical
  network                 network_s - typical network_s

batch_interference and speculation_rejections are capped at the request's per-token decode excess,
decode_s - (output_tokens - 1) * typical decode seconds per token: a slowdown every request had is
typical, not a cause. The winner must explain at least EXPLAINED_SHARE of how much slower than
typical the request is on the metric it was judged on (e2e; ttft or itl under an SLO), else the
request is `unattributed`. Under a TTFT SLO only the causes before the first token compete, under an
ITL SLO only those inside decode. When the typical request itself is over the SLO (an overload), the
queue, stall and network parts are measured from zero instead of from the typical request.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from infersight.correlate.requests import PARTS
from infersight.correlate.spec_step_costs import ENGINE_ID_SHIFT

NS = 1e9
FEATURE_DTYPES = {
    "uncached_tokens": "int64",            # prompt_tokens - cached_tokens: what prefill computed
    "recompute_preemptions": "int64", "swap_preemptions": "int64",
    "recompute_s": "float64",              # prefill chunks after its first recompute preemption
    "reloaded_blocks": "int64",            # KV blocks copied back from the CPU tier
    "spec_verifications": "int64", "spec_accepted": "int64",
    "decode_clean_steps": "int64", "decode_clean_s": "float64",                    # decode steps, no prefill beside
    "decode_beside_prefill_steps": "int64", "decode_beside_prefill_s": "float64",  # beside others' prefill chunks
    "host_pauses": "int64", "host_pause_s": "float64",  # garbage collections from arrival to finish, their time
    "host_pause_ttft_s": "float64",                     # ...of it before the first token
}
SLOW_DTYPES = {"request_id": "int64", "slow_cause": "object", "detail": "object", "excess_s": "float64"}
SLOW_COLUMNS = list(SLOW_DTYPES)
#: A prompt (output) this many times the typical length counts as long.
LONG_FACTOR = 2.0
#: ...and a prompt this many tokens longer than typical: a few tokens more, twice a tiny typical
#: (most of it cached), fit in the same single prefill step and explain nothing.
LONG_PROMPT_EXTRA_TOKENS = 128
#: The winning cause must explain at least this share of the request's excess over typical.
EXPLAINED_SHARE = 0.25
CAUSES = ("host_pause", "queue_wait", "long_prompt", "preemption", "kv_reload", "batch_interference",
          "speculation_rejections", "long_output", "network")
#: The causes that can make each judged metric slow.
CANDIDATES = {"e2e": CAUSES,
              "ttft": ("host_pause", "queue_wait", "long_prompt", "preemption", "kv_reload", "network"),
              "itl": ("host_pause", "batch_interference", "speculation_rejections", "preemption", "kv_reload")}
_INT64_MAX = np.iinfo(np.int64).max


def slow_features(rows: pd.DataFrame, request_events: pd.DataFrame, steps: pd.DataFrame | None = None,
                  batch: pd.DataFrame | None = None, spec: pd.DataFrame | None = None,
                  kv_events: pd.DataFrame | None = None, host_pauses: pd.DataFrame | None = None) -> pd.DataFrame:
    """rows (request_table()) plus the FEATURE_DTYPES columns, from the requests' events (PREEMPTED
    reasons, PREFILL_CHUNK), the `spec` frame (verifications with proposed > 0), `kv_events`
    (reloaded), `steps` + `batch` (which steps each request decoded in, and whether prefill
    tokens ran beside it; a request's own re-prefill steps are not decode steps) and `host_pauses`
    (the time of its engine's pauses inside [arrival, finish] and [arrival, first token]). A frame
    not given leaves its columns 0. Inputs are not changed."""
    ids = pd.Index(rows["request_id"].to_numpy(np.int64))
    out = rows.copy()
    out["uncached_tokens"] = (rows["prompt_tokens"] - rows["cached_tokens"]).clip(lower=0).to_numpy(np.int64)
    # Per request by position lookups and bincounts (rows hold one row per request): pandas'
    # groupby + reindex cost ms each on every poll.
    position = _positions(ids.to_numpy(np.int64))
    # Masks first, then the few rows they pick: filtering every event row would copy its strings.
    in_ids = position(request_events["request_id"].to_numpy(np.int64)) >= 0
    event = request_events["event"]
    pre = request_events[in_ids & (event == "PREEMPTED").to_numpy(bool)]
    recompute = pre[pre["reason"] == "recompute"]

    def at(frame: pd.DataFrame) -> np.ndarray:
        return position(frame["request_id"].to_numpy(np.int64))

    def count(frame: pd.DataFrame) -> np.ndarray:
        where = at(frame)
        return np.bincount(where[where >= 0], minlength=len(ids))

    def total(where: np.ndarray, values: np.ndarray) -> np.ndarray:
        out = np.zeros(len(ids), np.int64)  # int64 sums: exact, as groupby's
        np.add.at(out, where[where >= 0], values[where >= 0])
        return out

    out["recompute_preemptions"] = count(recompute)
    out["swap_preemptions"] = count(pre[pre["reason"] == "swap"])
    chunks = request_events[in_ids & (event == "PREFILL_CHUNK").to_numpy(bool)]
    first_recompute = np.full(len(ids), _INT64_MAX, np.int64)
    np.minimum.at(first_recompute, at(recompute), recompute["ts_ns"].to_numpy(np.int64))
    chunk_at = at(chunks)
    chunk_ts = chunks["ts_ns"].to_numpy(np.int64)
    redo = chunk_ts >= first_recompute[chunk_at]
    redo_ns = np.clip(chunks["end_ns"].to_numpy(np.int64) - chunk_ts, 0, None)
    out["recompute_s"] = total(chunk_at[redo], redo_ns[redo]) / NS
    reloads = np.zeros(len(ids), np.int64)
    if kv_events is not None and not kv_events.empty:
        reloads = count(kv_events[kv_events["event"] == "reloaded"])
    out["reloaded_blocks"] = reloads
    verifs, accepted = np.zeros(len(ids), np.int64), np.zeros(len(ids), np.int64)
    if spec is not None and not spec.empty:
        proposed = spec[(spec["proposed"].to_numpy() > 0) & (position(spec["request_id"].to_numpy(np.int64)) >= 0)]
        verifs = count(proposed)
        accepted = total(at(proposed), proposed["accepted"].to_numpy(np.int64))
    out["spec_verifications"] = verifs
    out["spec_accepted"] = accepted
    for key, value in _decode_steps(rows, chunks, steps, batch).items():
        out[key] = value
    for key, value in _host_pauses(rows, host_pauses).items():
        out[key] = value
    # Every feature column was built with its dtype: cast (which copies every column) only if not.
    if any(out[c].dtype != t for c, t in FEATURE_DTYPES.items()):
        out = out.astype(FEATURE_DTYPES)
    return out


def _decode_steps(rows: pd.DataFrame, chunks: pd.DataFrame, steps: pd.DataFrame | None,
                  batch: pd.DataFrame | None) -> dict[str, np.ndarray]:
    """Per request: decode steps (a batch row at or after its first token, not one of its own prefill
    chunks) with and without prefill tokens in the same step, and their summed durations."""
    ids = pd.Index(rows["request_id"].to_numpy(np.int64))
    zeros = {"decode_clean_steps": np.zeros(len(ids), np.int64), "decode_clean_s": np.zeros(len(ids)),
             "decode_beside_prefill_steps": np.zeros(len(ids), np.int64),
             "decode_beside_prefill_s": np.zeros(len(ids))}
    if steps is None or batch is None or steps.empty or batch.empty:
        return zeros
    # Plain numpy over the columns (this runs on every batch row of every poll): batch row -> its
    # request's position in ids and its step's row in steps (first record of a step id).
    b_rid, b_step = batch["request_id"].to_numpy(np.int64), batch["step_id"].to_numpy(np.int64)
    position = _positions(ids.to_numpy(np.int64))
    req = position(b_rid)
    step_ids = steps["step_id"].to_numpy(np.int64)
    uniq, first_row = np.unique(step_ids, return_index=True)
    at = np.minimum(np.searchsorted(uniq, b_step), max(len(uniq) - 1, 0))
    has_step = (uniq[at] == b_step) if len(uniq) else np.zeros(len(b_step), bool)
    use = (req >= 0) & has_step
    if not use.any():
        return zeros
    req, srow = req[use], first_row[at[use]]
    start = steps["start_ns"].to_numpy(np.int64)[srow]
    first = rows["first_token_ns"].to_numpy(np.int64)[req]
    finish = rows["finish_ns"].to_numpy(np.int64)[req]
    # A request's own prefill chunk starts with the step it ran in: match (request, start) pairs as
    # one int64 key each (request position x dense code of the time), so no MultiIndex is built.
    # Only rows whose step starts at some chunk's time can match: code times among the chunks' only.
    creq = position(chunks["request_id"].to_numpy(np.int64))
    cts = chunks["ts_ns"].to_numpy(np.int64)[creq >= 0]
    times, code = np.unique(cts, return_inverse=True)
    at_time = np.minimum(np.searchsorted(times, start), max(len(times) - 1, 0))
    maybe = np.flatnonzero(times[at_time] == start) if len(times) else np.zeros(0, np.int64)
    own = np.zeros(len(start), bool)
    own[maybe] = np.isin(req[maybe] * len(times) + at_time[maybe], creq[creq >= 0] * len(times) + code)
    decode = (first >= 0) & (start >= first) & (start <= finish) & ~own
    beside = decode & (steps["prefill_tokens"].to_numpy(np.int64)[srow] > 0)
    clean = decode & ~beside
    dur = (steps["end_ns"].to_numpy(np.int64)[srow] - start).clip(min=0) / NS

    def total(mask: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        if weights is None:
            return np.bincount(req[mask], minlength=len(ids))
        # float64 even when no row is picked (bincount then returns int64 zeros, and the frame a cast)
        return np.bincount(req[mask], weights[mask], minlength=len(ids)).astype(np.float64, copy=False)

    return {"decode_clean_steps": total(clean, None).astype(np.int64), "decode_clean_s": total(clean, dur),
            "decode_beside_prefill_steps": total(beside, None).astype(np.int64),
            "decode_beside_prefill_s": total(beside, dur)}


def _host_pauses(rows: pd.DataFrame, pauses: pd.DataFrame | None) -> dict[str, np.ndarray]:
    """Per request: how many of its engine's pauses overlap [arrival, finish], their time inside it,
    and their time inside [arrival, first token] (to finish where it has none)."""
    n = len(rows)
    out = {"host_pauses": np.zeros(n, np.int64), "host_pause_s": np.zeros(n), "host_pause_ttft_s": np.zeros(n)}
    if pauses is None or pauses.empty or n == 0:
        return out
    # A pause stalls its own engine's requests only: a request id carries its ring's index above this bit.
    ring = rows["request_id"].to_numpy(np.int64) >> ENGINE_ID_SHIFT
    arrival, finish = rows["arrival_ns"].to_numpy(np.int64), rows["finish_ns"].to_numpy(np.int64)
    first = rows["first_token_ns"].to_numpy(np.int64)
    first = np.where(first >= 0, np.minimum(first, finish), finish)
    pause_ring = pauses["ring_index"].to_numpy(np.int64)
    for r in np.intersect1d(np.unique(ring), pause_ring).tolist():
        mine = pauses[pause_ring == r]
        order = np.argsort(mine["ts_ns"].to_numpy(np.int64), kind="stable")
        start, end = mine["ts_ns"].to_numpy(np.int64)[order], mine["end_ns"].to_numpy(np.int64)[order]
        # Disjoint and sorted (an engine's collections never overlap; a producer's records are not trusted):
        # each pause ends no earlier than the one before, and starts no earlier than it ended.
        end = np.maximum.accumulate(end)
        start = np.maximum(start, np.concatenate(([start[0]], end[:-1])))
        before = np.concatenate(([0], np.cumsum(end - start)))  # pause ns before each pause's start

        def paused_until(t: np.ndarray) -> np.ndarray:
            """Pause ns before each instant t."""
            k = np.searchsorted(end, t, side="right")  # pauses over by t
            inside = np.minimum(k, len(start) - 1)
            partial = np.where((k < len(start)) & (start[inside] < t), t - start[inside], 0)
            return before[k] + partial

        at = np.flatnonzero(ring == r)
        a, f, t = arrival[at], finish[at], first[at]
        out["host_pauses"][at] = np.searchsorted(start, f, side="left") - np.searchsorted(end, a, side="right")
        out["host_pause_s"][at] = (paused_until(f) - paused_until(a)) / NS
        out["host_pause_ttft_s"][at] = (paused_until(t) - paused_until(a)) / NS
    return out


def _positions(ids: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Lookup of each value's position in `ids` (distinct), -1 where absent, as Index.get_indexer
    gives it: through a table when the ids are dense, else by binary search over the few ids
    (rather than hashing every looked-up value)."""
    low, high = (int(ids.min()), int(ids.max())) if len(ids) else (0, -1)
    if len(ids) and high - low < max(4 * len(ids), 4096) and len(np.unique(ids)) == len(ids):
        # Dense ids (an engine's request ids count up): one table read per value, no search.
        table = np.full(high - low + 1, -1, np.int64)
        table[ids - low] = np.arange(len(ids))

        def lookup(values: np.ndarray) -> np.ndarray:
            inside = (values >= low) & (values <= high)  # compared before subtracting: no overflow
            return np.where(inside, table[np.where(inside, values, low) - low], -1)

        return lookup
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]

    def position(values: np.ndarray) -> np.ndarray:
        if len(sorted_ids) == 0:
            return np.full(len(values), -1, np.int64)
        at = np.minimum(np.searchsorted(sorted_ids, values), len(sorted_ids) - 1)
        return np.where(sorted_ids[at] == values, order[at], -1)

    return position


def _median(values: np.ndarray) -> float:
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else float("nan")


def _ratio(num: pd.Series, den: pd.Series) -> np.ndarray:
    den = den.to_numpy(np.float64)
    return np.divide(num.to_numpy(np.float64), den, out=np.full(len(den), np.nan), where=den > 0)


def typical_request(window: pd.DataFrame) -> dict[str, float]:
    """Medians over the window (slow_features rows): the request_table parts and ttft_s, itl_mean_s,
    e2e_s, uncached_tokens, output_tokens; prefill_s_per_token (per uncached token), decode_s_per_token
    (decode_s / (output_tokens - 1)), tau (tokens per verification, requests that speculated) and
    decode_step_s (clean decode step). NaN where no row has the data."""
    out = {c: _median(window[c].to_numpy()) for c in
           ("queue_s", "prefill_s", "preemption_stall_s", "decode_s", "network_s", "e2e_s", "ttft_s", "itl_mean_s",
            "uncached_tokens", "output_tokens")}
    out["prefill_s_per_token"] = _median(_ratio(window["prefill_s"], window["uncached_tokens"]))
    out["decode_s_per_token"] = _median(_ratio(window["decode_s"], window["output_tokens"] - 1))
    verifs = window["spec_verifications"]
    out["tau"] = _median(_ratio(window["spec_accepted"] + verifs, verifs))
    out["decode_step_s"] = _median(_ratio(window["decode_clean_s"], window["decode_clean_steps"]))
    pause, before_first = window["host_pause_s"].to_numpy(np.float64), window["host_pause_ttft_s"].to_numpy(np.float64)
    out["host_pause_s"], out["host_pause_ttft_s"] = _median(pause), _median(before_first)
    out["host_pause_itl_s"] = _median(pause - before_first)
    return out


def _excesses(r: object, typ: dict[str, float], from_zero: bool, metric: str = "e2e") -> dict[str, tuple[float, str]]:
    """cause -> (excess seconds, detail) for one slow_features row judged on `metric`."""
    g = lambda name: float(getattr(r, name))  # noqa: E731
    base = (lambda key: 0.0) if from_zero else (lambda key: np.nan_to_num(typ[key]))
    out: dict[str, tuple[float, str]] = {}
    paused, before_first = g("host_pause_s"), g("host_pause_ttft_s")
    part, key, where = {"ttft": (before_first, "host_pause_ttft_s", " before its first token"),
                        "itl": (paused - before_first, "host_pause_itl_s", " after its first token")}.get(
        metric, (paused, "host_pause_s", ""))
    out["host_pause"] = (part - np.nan_to_num(typ[key]),
                         f"its engine's process stood still {part:.3f} s in garbage collections{where} "
                         f"({int(g('host_pauses'))} while it was in flight; typical {np.nan_to_num(typ[key]):.3f} s)")
    queue = g("queue_s")
    out["queue_wait"] = (queue - base("queue_s"), f"waited {queue:.3f} s before first being scheduled "
                                                  f"(typical {typ['queue_s']:.3f} s)")
    uncached, prefill = g("uncached_tokens"), g("prefill_s")
    long_p = (uncached >= LONG_FACTOR * typ["uncached_tokens"]
              and uncached >= typ["uncached_tokens"] + LONG_PROMPT_EXTRA_TOKENS)
    priced = (uncached - typ["uncached_tokens"]) * typ["prefill_s_per_token"]
    out["long_prompt"] = (min(prefill - typ["prefill_s"], priced) if long_p and np.isfinite(priced) else 0.0,
                          f"{uncached:.0f} prompt tokens to compute (typical {typ['uncached_tokens']:.0f}): prefill "
                          f"{prefill:.3f} s (typical {typ['prefill_s']:.3f} s)")
    stall, n_rc, n_swap = g("preemption_stall_s"), int(g("recompute_preemptions")), int(g("swap_preemptions"))
    stall_excess = stall - base("preemption_stall_s")
    out["preemption"] = (stall_excess + g("recompute_s") if n_rc else 0.0,
                         f"preempted {n_rc + n_swap}x ({n_rc} with recompute): stalled {stall:.3f} s, then "
                         f"recomputed its KV for {g('recompute_s'):.3f} s")
    out["kv_reload"] = (stall_excess if n_swap and not n_rc else 0.0,
                        f"preempted {n_swap}x by swap: waited {stall:.3f} s for its KV "
                        f"({int(g('reloaded_blocks'))} block(s) reloaded) to come back from the CPU tier")
    out_tokens, decode = g("output_tokens"), g("decode_s")
    per_token_excess = decode - max(0.0, out_tokens - 1) * np.nan_to_num(typ["decode_s_per_token"])
    steps_beside, beside_s = g("decode_beside_prefill_steps"), g("decode_beside_prefill_s")
    n_clean = g("decode_clean_steps")
    clean_step = g("decode_clean_s") / n_clean if n_clean else typ["decode_step_s"]
    interference = beside_s - steps_beside * clean_step if steps_beside and np.isfinite(clean_step) else 0.0
    out["batch_interference"] = (min(interference, per_token_excess),
                                 f"{steps_beside:.0f} of its {steps_beside + n_clean:.0f} decode steps ran beside "
                                 f"prefill chunks, {1e3 * beside_s / max(steps_beside, 1):.1f} ms each against "
                                 f"{1e3 * np.nan_to_num(clean_step):.1f} ms")
    verifs = g("spec_verifications")
    tau = (g("spec_accepted") + verifs) / verifs if verifs else float("nan")
    lost = decode * (1 - tau / typ["tau"]) if verifs and np.isfinite(typ["tau"]) and tau < typ["tau"] else 0.0
    out["speculation_rejections"] = (min(lost, per_token_excess),
                                     f"{tau:.2f} tokens per verification (typical {typ['tau']:.2f}): "
                                     f"{g('spec_accepted'):.0f} draft tokens accepted in {verifs:.0f} steps")
    long_o = out_tokens >= LONG_FACTOR * typ["output_tokens"] and out_tokens > typ["output_tokens"]
    out["long_output"] = (decode - typ["decode_s"] if long_o else 0.0,
                          f"{out_tokens:.0f} output tokens (typical {typ['output_tokens']:.0f}): decode "
                          f"{decode:.3f} s (typical {typ['decode_s']:.3f} s)")
    net = g("network_s")
    out["network"] = (net - base("network_s"), f"spent {net:.3f} s in the network (typical {typ['network_s']:.3f} s)")
    return {k: (float(np.nan_to_num(v, nan=0.0)), d) for k, (v, d) in out.items()}


#: The request_table parts each judged metric is made of (network: only its receive side is before
#: the first token, which the table does not split off, so TTFT leaves it out).
METRIC_PARTS = {"e2e": tuple(PARTS), "ttft": ("queue_s", "prefill_s"), "itl": ("preemption_stall_s", "decode_s")}


def _slowest_part(r: object, metric: str, typ: dict[str, float]) -> tuple[str, float]:
    """The part of the judged metric the request spent the most time in over the typical request:
    (part without its _s, seconds over typical). Where an unattributed request's time went, so a
    reader can tell a host stall in prefill from a decode that ran slow everywhere."""
    over = {p: float(getattr(r, p)) - float(np.nan_to_num(typ[p])) for p in METRIC_PARTS.get(metric, PARTS)}
    part = max(over, key=over.__getitem__)
    return part.removesuffix("_s").replace("_", " "), over[part]


def _gap(r: object, metric: str, typ: dict[str, float]) -> float:
    """How much slower than typical the request is on the metric it was judged on, in seconds."""
    if metric == "ttft":
        return float(r.ttft_s) - typ["ttft_s"]  # type: ignore[attr-defined]
    if metric == "itl":
        return (float(r.itl_mean_s) - typ["itl_mean_s"]) * max(1, int(r.output_tokens) - 1)  # type: ignore[attr-defined]
    return float(r.e2e_s) - typ["e2e_s"]  # type: ignore[attr-defined]


def attribute_slow(slow: pd.DataFrame, window: pd.DataFrame) -> pd.DataFrame:
    """The cause of each slow request. slow: slow_features() rows of the slow requests, optionally
    with judge_slow's `metric` (default e2e) and `threshold_s` (an SLO: see the module docstring);
    window: slow_features() rows of recent requests, the typical request's population.

    Columns request_id, slow_cause (one of CAUSES or unattributed), detail (a sentence with the
    numbers), excess_s (the cause's excess over the typical request; for unattributed the largest
    one found). Inputs are not changed."""
    if slow.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in SLOW_DTYPES.items()})
    typ = typical_request(window if not window.empty else slow)
    causes, details, amounts = [], [], []
    for r in slow.itertuples(index=False):
        metric = str(getattr(r, "metric", "e2e"))
        threshold = float(getattr(r, "threshold_s", np.nan))
        from_zero = bool(np.isfinite(threshold) and typ.get(f"{'itl_mean' if metric == 'itl' else metric}_s",
                                                            np.nan) > threshold)
        ex = _excesses(r, typ, from_zero, metric)
        best = max(CANDIDATES.get(metric, CAUSES), key=lambda c: ex[c][0])  # ties: the first in CAUSES order
        amount, gap = ex[best][0], _gap(r, metric, typ)
        gap_text = f"{gap:+.3f} s over the typical {metric}" if np.isfinite(gap) else f"no typical {metric}"
        if amount > 0 and (from_zero or not np.isfinite(gap) or amount >= EXPLAINED_SHARE * gap):
            causes.append(best)
            details.append(f"{ex[best][1]}; {amount:.3f} s of its {gap_text}")
        else:
            causes.append("unattributed")
            part, over = _slowest_part(r, metric, typ)
            details.append(f"no cause explains its {gap_text} (largest: {best.replace('_', ' ')}, {amount:.3f} s); "
                           f"its {part} took {over:+.3f} s over the typical request's")
        amounts.append(amount)
    return pd.DataFrame({"request_id": slow["request_id"].to_numpy(np.int64), "slow_cause": causes,
                         "detail": details, "excess_s": amounts}).astype(SLOW_DTYPES)
