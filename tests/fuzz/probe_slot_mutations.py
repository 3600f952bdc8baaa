"""Ring slots for the probe-record fuzz: real slots renumbered to read as a ring's first events, and
structure-aware mutations of them (record fields at their type's limits, a slot's kind, length or
sequence number changed) that keep every other byte, so the record screen and the decoders see
them rather than the ring's sequence check alone.

A slot is `seq u64 | kind u16 | reserved u16 | length u32 | record` (probes.schema.SLOT_HEADER); a
record is the kind's structured dtype (probes.records), subarray fields included.
"""
from __future__ import annotations

import random
import struct

import numpy as np

from infersight.probes.records import record_registry
from infersight.probes.schema import SLOT_HEADER, SLOT_HEADER_SIZE

FLOAT_LIMITS = (float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324, -0.0, 1e18, 0.0)


def rebased(slots: bytes, slot_size: int) -> bytes:
    """`slots` with their sequence numbers made 0, 1, 2, ... (a slice of a live ring starts at its
    own seq: read as a new ring's first events, every slot would be a jump past the drop count,
    counted corrupt before any record in it is decoded)."""
    buf = bytearray(slots)
    for i in range(len(buf) // slot_size):
        struct.pack_into("<Q", buf, i * slot_size, i)
    return bytes(buf)


def integer_limits(dt: np.dtype, rng: random.Random) -> bytes:
    """A value at the integer type's limits (or a random one), in the type's little-endian bytes;
    one past the type's range wraps as a C store would (-1 in a u32 is 4,294,967,295)."""
    info = np.iinfo(dt)
    pick = rng.choice((0, 1, -1, info.max, info.max - 1, info.min, 2**31, 2**32, 2**53 + 1, 65_535, 65_536,
                       rng.randint(info.min, info.max)))
    return (pick % 2 ** (8 * dt.itemsize)).to_bytes(dt.itemsize, "little")


def _set_field(buf: bytearray, offset: int, dtype: np.dtype, rng: random.Random) -> None:
    """One field of the record at `offset` (one element, when it is a subarray) set to a limit."""
    name = rng.choice(dtype.names)
    sub, field_offset = dtype.fields[name][:2]
    base, count = (sub.base, int(np.prod(sub.shape))) if sub.shape else (sub, 1)
    at = offset + field_offset + rng.randrange(count) * base.itemsize
    if base.kind in "SV":  # text and raw bytes: invalid UTF-8, a lone surrogate, all 0xff, no NUL
        fill = rng.choice((b"\xff", b"\xed\xa0\x80", b"\xc3", b"x", bytes([rng.randrange(256)])))
        buf[at:at + base.itemsize] = (fill * base.itemsize)[:base.itemsize]
    elif base.kind == "f":
        buf[at:at + base.itemsize] = np.array(rng.choice(FLOAT_LIMITS), dtype=base.newbyteorder("<")).tobytes()
    else:
        buf[at:at + base.itemsize] = integer_limits(base, rng)


def _set_header(buf: bytearray, slot: int, slot_size: int, n_slots: int, rng: random.Random) -> None:
    """A slot's header changed: its record read as another kind (length fixed to match, or left),
    an unknown kind, a wrong length, or a seq repeated, backwards or far ahead."""
    registry = record_registry()
    at = slot * slot_size
    seq, kind, reserved, length = SLOT_HEADER.unpack_from(buf, at)
    choice = rng.randrange(4)
    if choice == 0:
        other = rng.choice(list(registry))
        kind, length = other.kind, rng.choice((other.dtype.itemsize, length))
    elif choice == 1:
        kind = rng.choice((0, 12_345, 65_535, kind))
        length = rng.choice((0, (length + 1) % 2**32, slot_size, 2**32 - 1, length))
    elif choice == 2:
        seq = rng.choice((0, max(seq - 1, 0), seq + n_slots, 2**63, 2**64 - 1))
    else:
        reserved = rng.choice((1, 65_535))
    SLOT_HEADER.pack_into(buf, at, seq, kind, reserved, length)


def field_mutations(seeds: list[bytes], slot_size: int, count: int, seed: int) -> list[bytes]:
    """`count` copies of (rebased) seeds with one to six changes each: mostly a record field at its
    type's limits, some slot headers changed (see _set_header)."""
    registry = record_registry()
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        buf = bytearray(rng.choice(seeds))
        n_slots = len(buf) // slot_size
        for _ in range(rng.randint(1, 6)):
            slot = rng.randrange(n_slots)
            kind = SLOT_HEADER.unpack_from(buf, slot * slot_size)[1]
            record_type = registry.get(kind)
            if record_type is None or rng.random() < 0.15:
                _set_header(buf, slot, slot_size, n_slots, rng)
            else:
                _set_field(buf, slot * slot_size + SLOT_HEADER_SIZE, record_type.dtype, rng)
        out.append(bytes(buf))
    return out


#: The most tokens one TOKENS event may claim (agent.rings.record_limits refuses more: the ITL fold makes a row
#: per token, so 2^63 - 1 ended in numpy's "negative dimensions" and 4e9 would ask for 96 GB).
MAX_TOKENS_PER_EVENT = 4096
