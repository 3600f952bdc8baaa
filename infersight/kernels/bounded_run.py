"""Run one file's analysis in a forked child with a deadline and a memory ceiling, so that no input
can hang the command or take the machine: `run_bounded(work, limits, what)` -> work()'s text.

Why a child and not a SIGALRM in-process: a Python signal handler runs only between bytecodes, and
the slow paths of a hostile file are single C calls (a huge integer's conversion, one regex, one
pandas kernel). The parent holds nothing but a pipe and kills the child at the deadline.

    parent --fork--> child: rlimit(AS), warnings off, text = work()
       ^                |
       +---- pipe ------+  b"o" + text  |  b"e" + message (ValueError / MemoryError / RecursionError)
                        |  b"b" + "Type: message" (anything else: still one line, naming the type)

The child's warnings (pandas / numpy RuntimeWarnings on garbled numbers) are not printed: whatever
made them either ends in the one-line error or did not matter to the result. Where fork is missing
(not POSIX) the work runs in-process with warnings off and no deadline.
"""
from __future__ import annotations

import os
import resource
import select
import signal
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from infersight.kernels.errors import TraceError

DEFAULT_TIME_LIMIT_S = 300.0
_OK, _ERROR, _BUG = b"o", b"e", b"b"


@dataclass(frozen=True)
class RunLimits:
    """time_limit_s: wall seconds for the analysis (None: no limit). memory_bytes: address space the
    child may add to what it has at the fork (None: no ceiling), never past the process's own
    RLIMIT_AS (see address_space_cap)."""

    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S
    memory_bytes: int | None = None


def default_memory_bytes() -> int | None:
    """The machine's physical memory: an allocation larger than that fails at once with a message,
    instead of swapping or meeting the OOM killer."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _quietly(work: Callable[[], str]) -> str:
    import numpy as np

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return work()


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def address_space_cap(mapped: int, memory_bytes: int, current: tuple[int, int]) -> int:
    """The child's RLIMIT_AS: what it has mapped plus `memory_bytes`, clamped to the limit the process
    runs under already (`current` = getrlimit's (soft, hard)). Raising the hard limit is refused
    without CAP_SYS_RESOURCE ("not allowed to raise maximum limit"), and a `ulimit -v` the user set
    is theirs to keep: the child never gets more than its parent had."""
    cap = mapped + memory_bytes
    for limit in current:  # the soft limit is <= the hard one; either may be RLIM_INFINITY
        if limit != resource.RLIM_INFINITY:
            cap = min(cap, limit)
    return cap


def _child(work: Callable[[], str], limits: RunLimits, fd: int) -> None:
    try:
        if limits.memory_bytes is not None and os.path.exists("/proc/self/statm"):
            cap = address_space_cap(_address_space(), limits.memory_bytes, resource.getrlimit(resource.RLIMIT_AS))
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        message = _OK + _quietly(work).encode("utf-8", "surrogateescape")
    except MemoryError:
        message = _ERROR + b"out of memory while analysing it (the file asks for more than the memory limit)"
    except RecursionError:
        message = _ERROR + b"nested too deeply to analyse"
    except ValueError as exc:  # TraceError and the other documented input errors
        message = _ERROR + str(exc).encode("utf-8", "replace")
    except BaseException as exc:  # noqa: BLE001 - reported as one line, named, never a traceback
        message = _BUG + f"{type(exc).__name__}: {exc}"[:500].encode("utf-8", "replace")
    view = memoryview(message)
    while view:
        view = view[os.write(fd, view[: 1 << 20]):]


def _collect(pid: int, fd: int, deadline: float | None) -> bytes | None:
    """Everything the child wrote, or None when the deadline passed first (the child is then killed)."""
    chunks: list[bytes] = []
    while True:
        wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def run_bounded(work: Callable[[], str], limits: RunLimits, what: str) -> str:
    """work()'s text, computed under `limits`; TraceError (one line, naming `what`) when it raised a
    documented error, ran out of time or memory, or died."""
    if not hasattr(os, "fork"):
        return _quietly(work)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            os.close(read_fd)
            _child(work, limits, write_fd)
        except BaseException:  # noqa: BLE001 - a broken pipe here means the parent is gone
            code = 1
        os._exit(code)
    os.close(write_fd)
    deadline = None if limits.time_limit_s is None else time.monotonic() + limits.time_limit_s
    try:
        message = _collect(pid, read_fd, deadline)
    except BaseException:  # Ctrl-C in the parent: the child goes too
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if message is None:
        raise TraceError(f"{what}: not analysed within {limits.time_limit_s:g} s (raise it with --time-limit)")
    if not message:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit code {os.WEXITSTATUS(status)}"
        raise TraceError(f"{what}: the analysis stopped without a result ({how})")
    tag, body = message[:1], message[1:].decode("utf-8", "surrogateescape")
    if tag == _OK:
        return body
    if tag == _ERROR:
        raise TraceError(body if body.startswith(what) else f"{what}: {body}")
    raise TraceError(f"{what}: cannot be analysed ({body})")
