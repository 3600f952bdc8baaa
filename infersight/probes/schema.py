"""Record-type registry and the binary layout/header encoding of a probe ring.

A *record type* is a fixed-size numpy structured dtype identified by a small
integer kind id, with a name and a version.  The producer writes the table of
its record types into the ring header so that a consumer in another process
can check, before decoding a byte, that it agrees with the producer on every
kind (same name, version and itemsize).  The layout is drawn in ``ring.py``;
this module owns the byte offsets, the header encode/decode and ``RingView``,
the typed windows onto a mapped ring that both ring ends build on.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Callable, Iterable, Iterator, NamedTuple, TypeVar

import numpy as np

MAGIC = b"ISPRING\x00"
# 2: reader lease, in-flight batch and writer identity (probes/ring_lease.py); 3: a step's TOKENS and
# batch members written many to a slot (probes/record_batches.py); 4: STEP_TIMING counts the CUDA
# graphs a step captured (a one-time cost the speedup prediction leaves out); 5: the writer's
# heartbeat (probes/ring_heartbeat.py), so that a reader in another pid namespace tells a dead writer.
LAYOUT_VERSION = 5

# Static header: magic, layout version, header size, slot size, capacity,
# number of record types, producer pid, wall/monotonic anchor (ns).
# Little-endian with explicit sizes: no dependence on C struct padding.
_STATIC = struct.Struct("<8sIIIIIIqq")

# Live counters are u64 at 8-byte aligned offsets.  Producer-owned and
# consumer-owned counters sit on different 64-byte cache lines so the two
# processes never write to the same line (no false sharing).
PRODUCER_COUNTERS_OFFSET = 64
WRITE_POS, PRODUCED, DROPPED = range(3)
N_PRODUCER_COUNTERS = 3
# Consumer line: read position, next expected event sequence number and the
# running totals.  They live in the ring, not in the consumer object, so a
# restarted consumer resumes the accounting where the previous one stopped.
CONSUMER_COUNTERS_OFFSET = 128
READ_POS, NEXT_SEQ, CONSUMED, CORRUPT, DROPPED_SEEN, PENDING_BAD = range(6)
N_CONSUMER_COUNTERS = 6

# Type-table entry: kind u16, version u16, itemsize u32, name (UTF-8, NUL
# padded); 48 bytes keeps entries 8-byte aligned.
TYPE_TABLE_OFFSET = 192
_TYPE_ENTRY = struct.Struct("<HHI40s")
TYPE_ENTRY_SIZE = _TYPE_ENTRY.size
MAX_NAME_BYTES = 40
MAX_TYPES = 1024

# Slot header: event sequence number u64, kind u16, reserved u16, payload
# length u32.  The record follows at offset 16, so it is 8-byte aligned.
SLOT_HEADER = struct.Struct("<QHHI")
SLOT_HEADER_SIZE = SLOT_HEADER.size
SLOT_HEADER_DTYPE = np.dtype({"names": ["seq", "kind", "length"], "formats": ["<u8", "<u2", "<u4"],
                              "offsets": [0, 8, 12], "itemsize": SLOT_HEADER_SIZE})


class RingFormatError(ValueError):
    """The shared memory region is not a ring this code can read."""


class TypeEntry(NamedTuple):
    """A record type as stored in the ring header (its size, not its dtype)."""

    kind: int
    version: int
    itemsize: int
    name: str


@dataclass(frozen=True)
class RecordType:
    """One record kind: kind id (1..65535), name, version, structured dtype.

    Kind 0 is reserved so that a never-written (zeroed) slot reads as an
    unknown kind instead of as a valid record.
    """

    kind: int
    name: str
    version: int
    dtype: np.dtype

    def __post_init__(self) -> None:
        dt = np.dtype(self.dtype)
        object.__setattr__(self, "dtype", dt)  # frozen: normalise once, here
        if not 1 <= self.kind <= 0xFFFF or not 0 <= self.version <= 0xFFFF:
            raise ValueError(f"{self.name!r}: kind must be 1..65535 and version 0..65535")
        if dt.names is None or dt.itemsize == 0 or dt.hasobject:
            raise ValueError(f"{self.name!r}: needs a non-empty structured dtype without object fields")
        if not self.name or len(self.name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"record type name must be 1..{MAX_NAME_BYTES} UTF-8 bytes: {self.name!r}")

    @property
    def entry(self) -> TypeEntry:
        return TypeEntry(self.kind, self.version, self.dtype.itemsize, self.name)


#: Rewrites one read ({kind: records}, {kind: their slots' positions in the read}) into the records
#: readers see, and says how many slots it refused (see RecordRegistry).
Expand = Callable[[dict[int, np.ndarray], dict[int, np.ndarray]], tuple[dict[int, np.ndarray], int]]


class RecordRegistry:
    """A set of record types; kind ids and names are unique within it.

    ``expand``, when given, is applied by a consumer to every read: a registry whose kinds include
    batched forms of others (many records to a slot) hands its readers the unbatched records.
    """

    def __init__(self, types: Iterable[RecordType] = (), expand: Expand | None = None) -> None:
        self.expand = expand
        self._by_kind: dict[int, RecordType] = {}
        for rt in types:
            self.add(rt)

    def add(self, rt: RecordType) -> RecordType:
        old = self._by_kind.get(rt.kind)
        if old is not None and old != rt:
            raise ValueError(f"kind {rt.kind} already registered as {old.name!r} v{old.version}")
        if old is None and any(t.name == rt.name for t in self._by_kind.values()):
            raise ValueError(f"record type name {rt.name!r} already registered")
        self._by_kind[rt.kind] = rt
        return rt

    def get(self, kind: int) -> RecordType | None:
        return self._by_kind.get(kind)

    def __contains__(self, kind: object) -> bool:
        return kind in self._by_kind

    def __iter__(self) -> Iterator[RecordType]:
        return iter(sorted(self._by_kind.values(), key=lambda t: t.kind))

    def __len__(self) -> int:
        return len(self._by_kind)


def as_registry(types: RecordRegistry | Iterable[RecordType]) -> RecordRegistry:
    return types if isinstance(types, RecordRegistry) else RecordRegistry(types)


@dataclass(frozen=True)
class RingHeader:
    """Decoded static header: geometry, anchors and the record-type table."""

    slot_size: int
    capacity: int
    types: tuple[TypeEntry, ...]
    producer_pid: int = 0
    anchor_wall_ns: int = 0
    anchor_mono_ns: int = 0

    @property
    def header_size(self) -> int:
        """Bytes before slot 0, rounded up to 64 so slot 0 starts on a cache line."""
        return (TYPE_TABLE_OFFSET + len(self.types) * TYPE_ENTRY_SIZE + 63) // 64 * 64

    @property
    def total_size(self) -> int:
        return self.header_size + self.capacity * self.slot_size

    def slot_offset(self, position: int) -> int:
        """Byte offset of the slot that ring position ``position`` maps to."""
        return self.header_size + (position % self.capacity) * self.slot_size


def plan_header(capacity: int, slot_size: int | None, registry: RecordRegistry, pid: int,
                anchor_wall_ns: int, anchor_mono_ns: int) -> RingHeader:
    """Validate the geometry of a new ring; ``slot_size=None`` fits the largest type."""
    if not len(registry) or len(registry) > MAX_TYPES:
        raise ValueError(f"a ring needs 1..{MAX_TYPES} record types, got {len(registry)}")
    need = (SLOT_HEADER_SIZE + max(t.dtype.itemsize for t in registry) + 7) // 8 * 8
    slot_size = need if slot_size is None else slot_size
    if slot_size < need or slot_size % 8 or slot_size >= 2**32:
        raise ValueError(f"slot_size must be a multiple of 8, at least {need}, got {slot_size}")
    if not 1 <= capacity < 2**32:
        raise ValueError(f"capacity must be in 1..2**32-1, got {capacity}")
    entries = tuple(t.entry for t in registry)
    return RingHeader(slot_size, capacity, entries, pid, anchor_wall_ns, anchor_mono_ns)


def encode_header(buf: memoryview, header: RingHeader) -> None:
    """Write the static header and type table; counters are left as they are (zero)."""
    _STATIC.pack_into(buf, 0, MAGIC, LAYOUT_VERSION, header.header_size, header.slot_size,
                      header.capacity, len(header.types), header.producer_pid,
                      header.anchor_wall_ns, header.anchor_mono_ns)
    for i, e in enumerate(header.types):
        _TYPE_ENTRY.pack_into(buf, TYPE_TABLE_OFFSET + i * TYPE_ENTRY_SIZE,
                              e.kind, e.version, e.itemsize, e.name.encode())


def decode_header(buf: memoryview, region_size: int) -> RingHeader:
    """Parse and validate a header; every inconsistency is a RingFormatError."""
    if region_size < TYPE_TABLE_OFFSET:
        raise RingFormatError(f"region is {region_size} bytes, smaller than the "
                              f"{TYPE_TABLE_OFFSET}-byte ring header: truncated or not a ring")
    magic, version, hsize, slot_size, capacity, n_types, pid, wall, mono = _STATIC.unpack_from(buf, 0)
    if magic != MAGIC:
        raise RingFormatError(f"not an infersight probe ring: magic {magic!r}, expected {MAGIC!r}")
    if version != LAYOUT_VERSION:
        raise RingFormatError(f"ring layout version {version} is not supported "
                              f"(this reader understands version {LAYOUT_VERSION}): the engine and the "
                              "agent run different infersight versions; upgrade both")
    if not 0 < n_types <= MAX_TYPES:
        raise RingFormatError(f"ring header declares {n_types} record types (expected 1..{MAX_TYPES})")
    if capacity == 0 or slot_size % 8 or slot_size <= SLOT_HEADER_SIZE:
        raise RingFormatError(f"bad ring geometry: capacity {capacity}, slot size {slot_size}")
    shell = RingHeader(slot_size, capacity, (TypeEntry(0, 0, 0, ""),) * n_types)
    if hsize != shell.header_size:
        raise RingFormatError(f"header size {hsize} does not match {n_types} record types")
    if region_size < hsize:
        raise RingFormatError(f"region is {region_size} bytes, truncated inside the {hsize}-byte header")
    types = []
    for i in range(n_types):
        kind, tver, isz, raw = _TYPE_ENTRY.unpack_from(buf, TYPE_TABLE_OFFSET + i * TYPE_ENTRY_SIZE)
        name = raw.rstrip(b"\x00").decode(errors="replace")
        if kind == 0 or isz == 0 or isz > slot_size - SLOT_HEADER_SIZE:
            raise RingFormatError(f"record type {name!r}: kind {kind}, itemsize {isz} "
                                  f"does not fit a {slot_size}-byte slot")
        types.append(TypeEntry(kind, tver, isz, name))
    if len({t.kind for t in types}) != len(types):
        raise RingFormatError("ring header lists the same kind id twice")
    header = RingHeader(slot_size, capacity, tuple(types), pid, wall, mono)
    if region_size < header.total_size:
        raise RingFormatError(f"region is {region_size} bytes but the header describes {capacity} "
                              f"slots of {slot_size} bytes ({header.total_size} bytes): truncated")
    return header


def resolve_dtypes(header: RingHeader, known: RecordRegistry | None, ring: str) -> dict[int, np.dtype]:
    """Map each kind on the ring to the reader's dtype, refusing any mismatch.
    Without a registry, records come back as raw ``V<itemsize>`` arrays."""
    dtypes: dict[int, np.dtype] = {}
    for e in header.types:
        rt = None if known is None else known.get(e.kind)
        if known is not None and rt is None:
            raise RingFormatError(f"ring {ring!r} carries kind {e.kind} ({e.name!r} v{e.version}), "
                                  "which this reader does not know")
        if rt is not None and rt.entry != e:
            raise RingFormatError(f"ring {ring!r} kind {e.kind} is {e.name!r} v{e.version} "
                                  f"({e.itemsize} bytes) but this reader expects {rt.name!r} "
                                  f"v{rt.version} ({rt.dtype.itemsize} bytes)")
        dtypes[e.kind] = np.dtype((np.void, e.itemsize)) if rt is None else rt.dtype
    return dtypes


def slot_field(buf: memoryview, header: RingHeader, dtype: np.dtype, offset: int) -> np.ndarray:
    """A (capacity,) view of ``dtype`` at ``offset`` in every slot (stride: the slot size)."""
    wrapper = np.dtype({"names": ["v"], "formats": [dtype], "offsets": [offset], "itemsize": header.slot_size})
    return np.ndarray((header.capacity,), wrapper, buffer=buf, offset=header.header_size)["v"]


_View = TypeVar("_View", bound="RingView")


class RingView:
    """Typed windows onto a mapped ring: counter memoryviews and per-slot numpy views.

    Base of both ring ends; ``close`` releases every view before unmapping.
    """

    def __init__(self, shm: SharedMemory, header: RingHeader, dtypes: dict[int, np.dtype]) -> None:
        if sys.byteorder != "little":  # counters are native u64; the layout is little-endian
            raise RuntimeError("probe rings need a little-endian host")
        self._shm, self._closed, self.name, self.header = shm, False, shm.name, header
        self._capacity, self._slot_size, self._slot0 = header.capacity, header.slot_size, header.header_size
        self._buf = shm.buf
        self._pc = shm.buf[PRODUCER_COUNTERS_OFFSET:][:8 * N_PRODUCER_COUNTERS].cast("Q")
        self._cc = shm.buf[CONSUMER_COUNTERS_OFFSET:][:8 * N_CONSUMER_COUNTERS].cast("Q")
        self._slot_hdr = slot_field(shm.buf, header, SLOT_HEADER_DTYPE, 0)
        self._payload = {k: slot_field(shm.buf, header, dt, SLOT_HEADER_SIZE) for k, dt in dtypes.items()}
        self._itemsize = {t.kind: t.itemsize for t in header.types}

    @property
    def anchor(self) -> tuple[int, int]:
        """(time.time_ns(), time.monotonic_ns()) taken together when the ring was created."""
        return self.header.anchor_wall_ns, self.header.anchor_mono_ns

    def to_wall_ns(self, mono_ns: int | np.ndarray) -> int | np.ndarray:
        """Convert the producer's monotonic timestamps to wall-clock ns."""
        return mono_ns - self.header.anchor_mono_ns + self.header.anchor_wall_ns

    def stats(self) -> dict[str, int]:
        """Counters as stored in the ring (both ends see the same numbers)."""
        pc, cc = self._pc, self._cc
        produced, written, dropped = pc[PRODUCED], pc[WRITE_POS], pc[DROPPED]
        return {"produced": produced, "written": written, "dropped": dropped, "consumed": cc[CONSUMED],
                "corrupt": cc[CORRUPT], "dropped_seen": cc[DROPPED_SEEN],
                "backlog": written - cc[READ_POS], "capacity": self._capacity}

    def close(self) -> None:
        """Unmap the segment; every view goes first, else mmap refuses to close."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._slot_hdr = self._payload = self._buf = None  # type: ignore[assignment]
            self._pc.release()
            self._cc.release()
            self._shm.close()

    def __enter__(self: _View) -> _View:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()  # drop our views first, else SharedMemory.__del__ hits BufferError
