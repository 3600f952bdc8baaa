"""Seeded fuzzing for decoders of outside data: mutate real inputs, run each case in a child process
with a time limit and a memory ceiling, and report every case that raised something other than the
decoder's documented error, hung, or ran out of memory.

Cases run in a forked child so that a hang or an allocation storm is caught and cannot take the test
process with it: the child's address space is capped at its size after the fork plus `mem_mb`, and
each case gets `SIGALRM` after `per_case_s`. A failing case is reported with its index and the seed,
so `mutations(seed)[index]` rebuilds it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import resource
import signal
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

DEFAULT_CASES = 300


def case_count(default: int = DEFAULT_CASES) -> int:
    """How many cases a fuzz test runs: `INFERSIGHT_FUZZ_CASES` when set (e.g. 5000 for a long run)."""
    return int(os.environ.get("INFERSIGHT_FUZZ_CASES", default))


# Values that broke parsers before: huge and tiny numbers, deep nesting, bad unicode, long fields.
INTERESTING = (b"1e999999", b"-1e999", b"1e308", b"9" * 400, b"-1", b"0", b"NaN", b"inf", b"-0",
               b"18446744073709551616", b"4294967296", b"\xff\xfe", b"\xed\xa0\x80", b"\x00",
               b"[" * 2000, b"{" * 2000, b'"' + b"x" * 131_072 + b'"', b"null", b"true", b"\n\n",
               b"\\ud800", b"2147483648", b"-9223372036854775809")


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One seeded mutation of `data`: bit flips, byte runs, splices of interesting values, cuts."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(6)
        pos = rng.randrange(len(buf) + 1)
        if choice == 0 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif choice == 1:
            buf[pos:pos] = rng.choice(INTERESTING)
        elif choice == 2 and buf:
            end = min(len(buf), pos + rng.randint(1, 64))
            buf[pos:end] = rng.choice(INTERESTING)
        elif choice == 3:
            buf = buf[:pos]
        elif choice == 4 and buf:
            i = rng.randrange(len(buf))
            buf[pos:pos] = buf[i:i + rng.randint(1, 256)] * rng.randint(1, 8)
        else:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return bytes(buf)


def mutations(seeds: Sequence[bytes], count: int, seed: int) -> list[bytes]:
    """`count` seeded mutations of the given real inputs (the same list for the same arguments)."""
    rng = random.Random(seed)
    return [mutate(rng.choice(seeds), rng) for _ in range(count)]


@dataclass(frozen=True)
class Failure:
    """One case that did not end in success or an allowed error."""
    index: int
    kind: str  # "exception", "hang", "memory", "crash"
    detail: str


class _CaseTimeout(BaseException):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _CaseTimeout()


def _child(decode: Callable[[bytes], object], cases: list[bytes], allowed: tuple[type[BaseException], ...],
           per_case_s: float, mem_mb: int, conn: "mp.connection.Connection") -> None:
    current = _address_space_bytes()
    limit = current + mem_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    failures = []
    for index, case in enumerate(cases):
        conn.send(("at", index))
        signal.setitimer(signal.ITIMER_REAL, per_case_s)
        try:
            decode(case)
        except _CaseTimeout:
            failures.append(Failure(index, "hang", f"over {per_case_s} s"))
        except MemoryError:
            failures.append(Failure(index, "memory", f"over {mem_mb} MiB"))
        except allowed:
            pass
        except BaseException:  # noqa: BLE001 - anything else is the failure being looked for
            failures.append(Failure(index, "exception", traceback.format_exc(limit=-3)))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    conn.send(("done", failures))


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def fuzz(decode: Callable[[bytes], object], cases: Iterable[bytes], allowed: tuple[type[BaseException], ...],
         per_case_s: float = 2.0, mem_mb: int = 512) -> list[Failure]:
    """Run `decode` on every case in a forked child; return the cases that failed.

    `allowed` are the decoder's documented errors (e.g. `ValueError` subclasses that become a one-line
    message or a counted drop). A case that crashes the child outright is reported as "crash" and the
    remaining cases go on in a new child.
    """
    todo = list(cases)
    failures: list[Failure] = []
    offset = 0
    ctx = mp.get_context("fork")
    while offset < len(todo):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(decode, todo[offset:], allowed, per_case_s, mem_mb, child))
        proc.start()
        child.close()
        last = -1
        finished = False
        while True:
            try:
                tag, value = parent.recv()
            except EOFError:
                break
            if tag == "at":
                last = value
            else:
                failures.extend(Failure(f.index + offset, f.kind, f.detail) for f in value)
                finished = True
                break
        proc.join()
        if finished:
            break
        crashed_at = offset + max(last, 0)
        failures.append(Failure(crashed_at, "crash", f"child exit code {proc.exitcode}"))
        offset = crashed_at + 1
    return failures


def describe(failures: list[Failure], limit: int = 5) -> str:
    """A short text of the first failures, for an assertion message."""
    lines = [f"{len(failures)} failing case(s)"]
    for f in failures[:limit]:
        lines.append(f"case {f.index} [{f.kind}]: {f.detail.strip().splitlines()[-1] if f.detail else ''}")
    return "\n".join(lines)
