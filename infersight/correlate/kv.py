"""KV block lifecycle: transition counts, the pool's current state, and how long content lives.

Input is the `kv_events` frame (ts_ns, event, block_id, request_id, block_hash), events in the
KVBlockEvent names, lower case. What the pool emits (runtime/kv/kv_pool.py, kv_cache.py) decides
how events are replayed:

  * ALLOCATED: a free block handed out (ref count := 1); if it came from the cached free list it is
    preceded by that block's EVICTED, whose request_id is the allocating request (who caused it).
    PREFIX_HIT: ref count + 1 (the block may have been cached). RESUME_HIT: the same for a preempted
    request taking cached KV again on re-admission; not a prefix hit (those are counted once per request).
  * FREED / CACHED are emitted only when the ref count reaches 0. A release by one of several
    sharers emits nothing, so the block correctly stays in use: no decrement is ever observed,
    and these events set the count to 0 rather than subtracting one.
  * OFFLOADED is emitted for each block just before the swap-out releases it (which then emits
    FREED/CACHED, or nothing if shared); RELOADED follows the ALLOCATED of the swap-in. Neither
    changes the state. RECOMPUTED marks a block in use being filled with evicted content.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.runtime.observer import KVBlockEvent

EVENT_NAMES = [e.name.lower() for e in KVBlockEvent]
#: Events that set a block's state; the rest (offloaded, recomputed) leave it unchanged.
STATE_OF = {"allocated": "in_use", "prefix_hit": "in_use", "resume_hit": "in_use", "reloaded": "in_use",
            "freed": "free", "evicted": "free", "cached": "cached"}
BLOCK_STATES = ("free", "in_use", "cached")
_INT64_MAX = np.iinfo(np.int64).max
LIFETIME_COLUMNS = {"block_id": "int64", "kind": "object", "seconds": "float64"}


def _ordered(kv_events: pd.DataFrame) -> pd.DataFrame:
    """Events per block in time order; ties keep frame (ring, i.e. emission) order."""
    return kv_events.sort_values(["block_id", "ts_ns"], kind="stable")


def transition_counts(kv_events: pd.DataFrame) -> dict[str, int]:
    """Count of each KVBlockEvent name (every name present, 0 if unseen; a missing event counts for none)."""
    codes, names = pd.factorize(kv_events["event"])  # a count per code: cheaper than value_counts' Series
    counts = dict(zip(names.tolist(), np.bincount(codes[codes >= 0], minlength=len(names)).tolist()))
    return {name: int(counts.get(name, 0)) for name in EVENT_NAMES}


def block_states(kv_events: pd.DataFrame, num_blocks: int) -> dict[str, int]:
    """{free, in_use, cached} block counts after replaying the events over a pool of num_blocks.

    Each block's state is set by its last state-setting event (see module docstring for why that
    equals replaying reference counts); a block never seen is free. Events for block ids outside
    [0, num_blocks) are ignored."""
    ev = kv_events[kv_events["event"].isin(list(STATE_OF)) & kv_events["block_id"].between(0, num_blocks - 1)]
    last = _ordered(ev).drop_duplicates("block_id", keep="last")
    counts = last["event"].map(STATE_OF).value_counts()
    out = {state: int(counts.get(state, 0)) for state in BLOCK_STATES}
    out["free"] += num_blocks - len(last)
    return out


def block_lifetimes(kv_events: pd.DataFrame) -> pd.DataFrame:
    """Columns block_id, kind, seconds; one row per completed interval, by block then time:

      lifetime           content born (ALLOCATED, or RELOADED not preceded by a birth since the last
                         death) until it dies (FREED or EVICTED of that block)
      idle_before_evict  last CACHED -> EVICTED (how long reusable content sat unused)
      reuse_gap          CACHED -> the next PREFIX_HIT or RESUME_HIT of the block (how long until content
                         was reused)

    Intervals still open at the end of the frame, or whose start precedes it, are not reported.
    """
    # Plain numpy over the columns (this runs on every poll's events): rows in _ordered's order.
    keep = np.flatnonzero(kv_events["event"].isin(list(STATE_OF)).to_numpy(bool))
    if len(keep) == 0:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in LIFETIME_COLUMNS.items()})
    block = kv_events["block_id"].to_numpy(np.int64)[keep]
    ts = kv_events["ts_ns"].to_numpy(np.int64)[keep]
    event = kv_events["event"].to_numpy(object)[keep]
    order = np.lexsort((ts, block))  # stable: ties keep frame order, as sort_values(kind="stable")
    block, ts, event = block[order], ts[order], event[order]
    same_block = np.r_[False, block[1:] == block[:-1]]  # the row before is the same block's
    prev_ts = np.where(same_block, np.r_[-1, ts[:-1]], -1)
    after_cached = same_block & np.r_[False, event[:-1] == "cached"]

    # Content segments: a segment of a block ends with (and includes) a death.
    death = np.isin(event, ["freed", "evicted"])
    deaths_before = np.cumsum(death) - death  # deaths strictly before each row, over all blocks
    block_start = np.flatnonzero(~same_block)
    seg = deaths_before - np.repeat(deaths_before[block_start], np.diff(np.r_[block_start, len(block)]))
    birth = np.isin(event, ["allocated", "reloaded"])
    run = np.cumsum(np.r_[True, (block[1:] != block[:-1]) | (seg[1:] != seg[:-1])]) - 1  # (block, seg) runs
    born = np.full(int(run[-1]) + 1, _INT64_MAX, np.int64)
    np.minimum.at(born, run[birth], ts[birth])
    # An int fill keeps int64 (a NaN would pass through float64 and lose ns beyond 2**53).
    born_at = born[run[death]]
    born_at = np.where(born_at == _INT64_MAX, -1, born_at)
    lived = born_at >= 0  # -1: the birth precedes the frame

    parts = [
        (block[death][lived], "lifetime", ts[death][lived] - born_at[lived], ts[death][lived]),
        *((block[m], kind, ts[m] - prev_ts[m], ts[m]) for kind, m in
          (("idle_before_evict", (event == "evicted") & after_cached),
           ("reuse_gap", np.isin(event, ["prefix_hit", "resume_hit"]) & after_cached))),
    ]
    out_block = np.concatenate([p[0] for p in parts])
    by_end = np.lexsort((np.concatenate([p[3] for p in parts]), out_block))  # stable, as sort_values
    # Built with LIFETIME_COLUMNS' dtypes (kind an object Series: pandas would infer its str dtype,
    # and a cast back costs ms on every poll).
    return pd.DataFrame({
        "block_id": out_block[by_end],
        "kind": pd.Series(np.concatenate([np.full(len(p[0]), p[1], dtype=object) for p in parts])[by_end],
                          dtype=object),
        "seconds": (np.concatenate([p[2] for p in parts]) / 1e9)[by_end]})


def recomputed_blocks(kv_events: pd.DataFrame) -> int:
    """How many blocks were filled again with content that had been evicted (wasted prefill)."""
    return int((kv_events["event"] == "recomputed").sum())
