"""Reading a capture file from outside with its size known first: regular files only, a byte limit,
and a bounded gunzip.

A path that names a FIFO, a device, a socket or a directory is refused before it is opened (opening a
FIFO for reading blocks until a writer appears; a device may never end). The file is then opened
non-blocking and checked again on the open descriptor, so a path swapped for a FIFO between the two
checks is still refused. Gzip is inflated in bounded chunks, so a small bomb stops at the limit
instead of taking the machine's memory. Every refusal is a TraceError naming the file.
"""
from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

from infersight.kernels.errors import TraceError

#: Default ceilings for `infersight analyze`: the largest Kineto traces we have seen are a few hundred
#: MB of JSON; a limit keeps a mistaken path (a disk image, /dev/zero's cousins) from being read.
MAX_FILE_BYTES = 2 << 30
MAX_INFLATED_BYTES = 2 * MAX_FILE_BYTES
_CHUNK = 1 << 20
_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def check_regular_file(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> int:
    """The size of `path` when it is a regular file of at most `max_bytes`; TraceError otherwise.
    Uses stat only (never opens the path), so a FIFO or a device cannot block it."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the file ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(f"{p}: {_kind(st.st_mode)}, not a capture file; give the path of a regular file")
    if st.st_size > max_bytes:
        raise TraceError(f"{p}: {st.st_size} bytes, over the limit of {max_bytes} bytes "
                         "(raise it with --max-bytes)")
    return st.st_size


def read_regular_file(path: str | Path, max_bytes: int = MAX_FILE_BYTES, head: int | None = None) -> bytes:
    """The bytes of a regular file (at most `head` of them when given), checked as
    check_regular_file says, before and after opening."""
    p = Path(path)
    check_regular_file(p, max_bytes)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the file ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraceError(f"{p}: {_kind(st.st_mode)}, not a capture file; give the path of a regular file")
        # read(n) allocates n bytes up front: ask for what the file holds (plus one, to see growth)
        limit = min(max_bytes, st.st_size) + 1 if head is None else min(head, max_bytes)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the file ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if head is None and len(data) > max_bytes:  # it grew since the stat
        raise TraceError(f"{p}: over the limit of {max_bytes} bytes (raise it with --max-bytes)")
    return data


def gunzip_bounded(raw: bytes, path: str | Path, max_bytes: int = MAX_INFLATED_BYTES) -> bytes:
    """The inflated content of a gzip file (every member of a multi-member one), or TraceError when
    the stream is corrupt or truncated or inflates past `max_bytes`."""
    out: list[bytes] = []
    size = 0

    def take(chunk: bytes) -> None:
        nonlocal size
        size += len(chunk)
        if size > max_bytes:
            raise TraceError(f"{path}: inflates to more than {max_bytes} bytes (a gzip bomb, or raise the "
                             "limit with --max-bytes)")
        out.append(chunk)

    rest = raw
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)  # 31: gzip header and trailer
            data = rest
            while data and not inflater.eof:  # at the end, unconsumed_tail still holds the rest
                take(inflater.decompress(data, _CHUNK))
                data = inflater.unconsumed_tail
            if not inflater.eof:  # all input taken, output may be pending: at most a window's worth
                take(inflater.flush())
            if not inflater.eof:
                raise TraceError(f"{path}: the gzip stream is truncated or corrupt (it ends before the gzip trailer)")
            rest = inflater.unused_data
            if not rest.strip(b"\x00"):  # padding after the last member
                break
    except zlib.error as exc:
        raise TraceError(f"{path}: the gzip stream is truncated or corrupt ({exc})") from None
    return b"".join(out)
