"""One KV-event batch, as values: encoded with each vLLM release's own structs (rebuilt from its
source, or imported), then decoded with our decoder (infersight.sources.vllm.kv_wire)."""
from __future__ import annotations

from typing import Any

from infersight.sources.vllm.kv_wire import AllBlocksCleared, BlockRemoved, BlockStored, KVBatch

SHA_HASH = bytes.fromhex("ab" * 32)  # vLLM's default sha256 block hash
INT_HASH = 12345  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
#: the sample for vllm_probe (JSON: a bytes hash is "b:<hex>")
SAMPLE: dict[str, Any] = {
    "ts": 1700000000.25, "data_parallel_rank": 2,
    "events": [
        {"type": "BlockStored", "block_hashes": ["b:" + SHA_HASH.hex(), INT_HASH], "parent_block_hash": 7,
         "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "medium": "GPU", "group_idx": 1, "session_id": "s1"},
        {"type": "BlockRemoved", "block_hashes": [INT_HASH], "medium": "CPU", "group_idx": 1},
        {"type": "AllBlocksCleared"},
    ],
}


def event_values(event: dict[str, Any]) -> dict[str, Any]:
    """A sample event's fields as Python values (hashes as bytes or int)."""
    out = {k: v for k, v in event.items() if k != "type"}
    out["block_hashes"] = [bytes.fromhex(h[2:]) if isinstance(h, str) else h for h in out.get("block_hashes", [])] \
        if "block_hashes" in out else None
    return {k: v for k, v in out.items() if v is not None}


def mismatches(batch: KVBatch) -> list[str]:
    """How our decoding of the sample differs from the sample (the expected values are the sample's)."""
    problems = []
    if batch.ts != SAMPLE["ts"] or batch.dp_rank != SAMPLE["data_parallel_rank"]:
        problems.append(f"ts/rank {batch.ts}/{batch.dp_rank}")
    if batch.dropped:
        problems.append(f"events dropped: {batch.errors}")
    if [type(e).__name__ for e in batch.events] != [e["type"] for e in SAMPLE["events"]]:
        return problems + [f"events {batch.events}"]
    stored, removed, cleared = batch.events
    want = event_values(SAMPLE["events"][0])
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved) and isinstance(cleared, AllBlocksCleared)
    got = {"block_hashes": stored.block_hashes, "parent_block_hash": stored.parent_block_hash,
           "block_size": stored.block_size, "medium": stored.medium, "group_idx": stored.group_idx,
           "session_id": stored.session_id}
    problems += [f"BlockStored.{k}: {got[k]!r} != {want[k]!r}" for k in got if got[k] != want[k]]
    want = event_values(SAMPLE["events"][1])
    got = {"block_hashes": removed.block_hashes, "medium": removed.medium, "group_idx": removed.group_idx}
    problems += [f"BlockRemoved.{k}: {got[k]!r} != {want[k]!r}" for k in got if got[k] != want[k]]
    return problems
