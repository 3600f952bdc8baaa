"""The run-time policy region of the control block: the agent's per-task speculation policy (with its
canary share) and the scheduler's max_num_seqs, set while the engine runs (`infersight agent
--auto-apply speculation`); the engine reads it at a step's start when its sequence number moved.

The region follows the capture fields (probes.control), in the bytes an engine of this version
creates beyond the first 512 (an older engine's block is 512 bytes: `has_policy` says no):

    512  policy_seq u64       (agent writes LAST: the engine sees the entries before the new seq)
    520  max_num_seqs u32     (0: the engine's configured limit) | n_entries u16 | pad u16
    528  ack_seq u64          (engine writes: the policy_seq it applied)
    536  configured u32 | pad (engine writes at start: its configured max_num_seqs, the most a policy may set)
    544  entries, ENTRY_BYTES each, up to MAX_ENTRIES:
           label 32s (UTF-8, NUL-padded) | speculate u8 | old_speculate u8 | control_permille u16 | pad u32

An entry says: requests of task `label` speculate (1) or not (0); a share control_permille / 1000 of
them, drawn at random per request, keeps `old_speculate` (the canary's control arm). A task without
an entry speculates when the engine has a draft model. The block is this user's shared memory (the
ring's owner); the agent writes it only behind its bearer token (POST /api/v1/decisions is not a
route: the agent's loop is the only writer).

A reader copies the region, then checks policy_seq again: an agent writing meanwhile makes it retry
at the next step (the seq moved), so a torn table is never applied.
"""
from __future__ import annotations

import struct

from infersight.runtime.engine.run_policy import LABEL_BYTES, RunPolicy, TaskPolicy

#: Where the policy region starts, and the size of a block that has one.
POLICY_OFFSET = 512
BLOCK_SIZE = 1024
ENTRY_BYTES = 40
_ENTRIES_AT = POLICY_OFFSET + 32
MAX_ENTRIES = (BLOCK_SIZE - _ENTRIES_AT) // ENTRY_BYTES
_HEAD = struct.Struct("<QIH2x")
_ENTRY = struct.Struct(f"<{LABEL_BYTES}sBBH4x")

__all__ = ["TaskPolicy", "RunPolicy", "write_policy", "read_policy", "read_seq", "read_ack", "acknowledge",
           "configured_max_num_seqs", "set_configured_max_num_seqs", "has_policy"]


def has_policy(buf: memoryview) -> bool:
    """Whether a control block (its buffer) is large enough to hold the policy region."""
    return len(buf) >= BLOCK_SIZE


def write_policy(buf: memoryview, max_num_seqs: int, tasks: tuple[TaskPolicy, ...]) -> int:
    """Agent side: write the table and publish it under the next seq (returned). ValueError for a
    block without the region or more tasks than fit."""
    if not has_policy(buf):
        raise ValueError("the engine's control block has no policy region (an older engine)")
    if len(tasks) > MAX_ENTRIES:
        raise ValueError(f"at most {MAX_ENTRIES} task policies fit the control block, got {len(tasks)}")
    if not 0 <= max_num_seqs < 1 << 32:
        raise ValueError(f"max_num_seqs must be a u32, got {max_num_seqs}")
    seq = read_seq(buf) + 1
    for i, t in enumerate(tasks):
        _ENTRY.pack_into(buf, _ENTRIES_AT + i * ENTRY_BYTES, t.label.encode(), int(t.speculate),
                         int(t.old_speculate), round(t.control_share * 1000))
    struct.pack_into("<IH", buf, POLICY_OFFSET + 8, max_num_seqs, len(tasks))
    struct.pack_into("<Q", buf, POLICY_OFFSET, seq)  # last: a reader sees the entries before the seq
    return seq


def read_seq(buf: memoryview) -> int:
    return int(struct.unpack_from("<Q", buf, POLICY_OFFSET)[0]) if has_policy(buf) else 0


def read_ack(buf: memoryview) -> int:
    return int(struct.unpack_from("<Q", buf, POLICY_OFFSET + 16)[0]) if has_policy(buf) else 0


def configured_max_num_seqs(buf: memoryview) -> int:
    return int(struct.unpack_from("<I", buf, POLICY_OFFSET + 24)[0]) if has_policy(buf) else 0


def set_configured_max_num_seqs(buf: memoryview, limit: int) -> None:
    """Engine side, at start: the limit it was configured with (a policy can only lower it)."""
    struct.pack_into("<I", buf, POLICY_OFFSET + 24, limit)


def acknowledge(buf: memoryview, seq: int) -> None:
    """Engine side: the policy of `seq` is in force."""
    struct.pack_into("<Q", buf, POLICY_OFFSET + 16, seq)


def read_policy(buf: memoryview) -> RunPolicy | None:
    """Engine side: the policy now in the region; None when a writer moved the seq while it was read
    (retry at the next step) or the block has no region. A malformed entry (a label that is not
    UTF-8) is skipped: the engine never fails for what the agent wrote."""
    if not has_policy(buf):
        return None
    seq, max_num_seqs, n = _HEAD.unpack_from(buf, POLICY_OFFSET)
    tasks = []
    for i in range(min(n, MAX_ENTRIES)):
        raw, speculate, old, permille = _ENTRY.unpack_from(buf, _ENTRIES_AT + i * ENTRY_BYTES)
        try:
            tasks.append(TaskPolicy(raw.rstrip(b"\0").decode(), bool(speculate), bool(old), min(permille, 1000) / 1000))
        except (UnicodeDecodeError, ValueError):
            continue
    if read_seq(buf) != seq:
        return None
    return RunPolicy(int(seq), int(max_num_seqs), tuple(tasks))
