"""Seeded fuzzing for decoders of outside data: mutate real inputs, run each case in a child process
with a time limit and a memory ceiling, and report every case that raised something other than the
decoder's documented error, hung, or ran out of memory.

Cases run in a forked child so that a hang or an allocation storm is caught and cannot take the test
process with it: the child's address space is capped at its size after the fork plus `mem_mb`, and
each case gets `SIGPROF` after `per_case_s` of its own CPU time (user + system: on a loaded machine a
wall-clock alarm fails cases that merely waited for a core), and the parent kills a child that has
not answered in WATCHDOG_S + 20 x `per_case_s` of wall time (stuck off the CPU). A failing case is reported with its index and the seed,
so `mutations(seed)[index]` rebuilds it.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import re
import resource
import signal
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

DEFAULT_CASES = 300
PROGRESS_EVERY = 250  # cases between progress lines of a reported run
WATCHDOG_S = 30.0  # wall seconds, plus 20 alarms' worth, before a silent child is killed as hung


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
    kind: str  # "exception", "hang", "memory", "crash", "unclear" (an allowed error with no message)
    detail: str


@dataclass
class FuzzRun:
    """What a fuzz run saw: its failures, and how the other cases ended.

    `outcomes` counts "accepted" (the decoder returned) and "refused: <error class>" (an allowed error
    with a message); `reasons` counts the refusals' messages with paths and digits blanked, so a
    summary says what was refused for; `tallies` sums what the decoder itself counted (a Counter it
    returned: slots found corrupt, records refused, ...)."""
    cases: int
    failures: list[Failure] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    tallies: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0


class _CaseTimeout(BaseException):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _CaseTimeout()


def refusal_reason(message: str) -> str:
    """A refusal's message as a family: paths and numbers blanked, cut before the first quoted or
    bracketed detail (the input's own text, which differs case by case) and at 64 characters."""
    words = ["<path>" if w.startswith("/") and len(w) > 1 else w for w in message.split()]
    family = re.split(r"[\"'(\[{]", re.sub(r"\d+", "N", " ".join(words)), maxsplit=1)[0]
    return family.strip()[:64] or message[:64]


def _outcome(decode: Callable[[bytes], object], case: bytes, allowed: tuple[type[BaseException], ...],
             per_case_s: float, mem_mb: int) -> tuple[str, str, Counter[str] | None]:
    """(kind, detail, tally) of one case: kind "accepted", "refused" (detail: the reason) or a Failure kind."""
    signal.setitimer(signal.ITIMER_PROF, per_case_s)
    try:
        result = decode(case)
    except _CaseTimeout:
        return "hang", f"over {per_case_s} s", None
    except MemoryError:
        return "memory", f"over {mem_mb} MiB", None
    except allowed as exc:
        message = " ".join(str(exc).split())
        if not message:  # the contract is a clear error: a refusal that says nothing is a failure
            return "unclear", f"{type(exc).__name__} with an empty message", None
        return "refused", f"{type(exc).__name__}\t{refusal_reason(message)}", None
    except BaseException:  # noqa: BLE001 - anything else is the failure being looked for
        return "exception", traceback.format_exc(limit=-3), None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    return "accepted", "", result if isinstance(result, Counter) else None


def _child(decode: Callable[[bytes], object], cases: list[bytes], allowed: tuple[type[BaseException], ...],
           per_case_s: float, mem_mb: int, conn: "mp.connection.Connection") -> None:
    current = _address_space_bytes()
    limit = current + mem_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGPROF, _on_alarm)
    for index, case in enumerate(cases):
        conn.send(("at", index))
        conn.send(("end", _outcome(decode, case, allowed, per_case_s, mem_mb)))
    conn.send(("done", None))


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def run_fuzz(decode: Callable[[bytes], object], cases: Iterable[bytes], allowed: tuple[type[BaseException], ...],
             per_case_s: float = 2.0, mem_mb: int = 512) -> FuzzRun:
    """Run `decode` on every case in a forked child; return the failures and how the rest ended.

    `allowed` are the decoder's documented errors (e.g. `ValueError` subclasses that become a one-line
    message or a counted drop); one with an empty message fails as "unclear". A case that crashes the
    child outright is a "crash", one that holds the child past the watchdog (stuck in C code, where the
    alarm's handler cannot run, or waiting) is killed as a "hang"; the remaining cases go on in a new child.
    """
    todo = list(cases)
    run = FuzzRun(cases=len(todo))
    started = time.monotonic()
    offset = 0
    ctx = mp.get_context("fork")
    while offset < len(todo):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(decode, todo[offset:], allowed, per_case_s, mem_mb, child))
        proc.start()
        child.close()
        last, done, stuck = -1, False, False
        while True:
            if not parent.poll(WATCHDOG_S + 20 * per_case_s):  # no CPU alarm: stuck off the CPU (a wait)
                stuck = True
                proc.kill()
                break
            try:
                tag, value = parent.recv()
            except EOFError:
                break
            if tag == "at":
                last = value
            elif tag == "end":
                _count(run, offset + last, *value)
                if (offset + last + 1) % PROGRESS_EVERY == 0:
                    run.wall_s = time.monotonic() - started
                    _progress(run, offset + last + 1)
            else:
                done = True
                break
        proc.join()
        parent.close()
        if done:
            break
        crashed_at = offset + max(last, 0)
        if stuck:
            run.failures.append(Failure(crashed_at, "hang", f"no answer in {WATCHDOG_S + 20 * per_case_s} s (killed)"))
        else:
            run.failures.append(Failure(crashed_at, "crash", f"child exit code {proc.exitcode}"))
        offset = crashed_at + 1
    run.wall_s = time.monotonic() - started
    return run


def _count(run: FuzzRun, index: int, kind: str, detail: str, tally: Counter[str] | None) -> None:
    if kind == "accepted":
        run.outcomes["accepted"] += 1
        run.tallies.update(tally or {})
    elif kind == "refused":
        error, reason = detail.split("\t", 1)
        run.outcomes[f"refused: {error}"] += 1
        run.reasons[reason] += 1
    else:
        run.failures.append(Failure(index, kind, detail))


def _progress(run: FuzzRun, done: int) -> None:
    """How far a long run is, as one JSON line in `INFERSIGHT_FUZZ_REPORT`.progress (when set): a run
    stopped early still says how many cases it ran and how they ended."""
    target = os.environ.get("INFERSIGHT_FUZZ_REPORT")
    if target:
        with open(target + ".progress", "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "done": done, "of": run.cases, "failures": len(run.failures),
                                "wall_s": round(run.wall_s, 1), "outcomes": dict(run.outcomes),
                                "first_failures": describe(run.failures).splitlines()[1:] if run.failures else [],
                                "tallies": dict(run.tallies)}) + "\n")


def fuzz(decode: Callable[[bytes], object], cases: Iterable[bytes], allowed: tuple[type[BaseException], ...],
         per_case_s: float = 2.0, mem_mb: int = 512) -> list[Failure]:
    """`run_fuzz`'s failures alone."""
    return run_fuzz(decode, cases, allowed, per_case_s, mem_mb).failures


def record(name: str, run: FuzzRun) -> None:
    """Append the run's summary as one JSON line to the file `INFERSIGHT_FUZZ_REPORT` names, when set
    (a long run's figures for BENCHMARKS.md; CI leaves it unset)."""
    target = os.environ.get("INFERSIGHT_FUZZ_REPORT")
    if not target:
        return
    line = {"test": name, "cases": run.cases, "failures": len(run.failures), "wall_s": round(run.wall_s, 1),
            "outcomes": dict(run.outcomes.most_common()), "top_reasons": dict(run.reasons.most_common(8)),
            "tallies": dict(run.tallies.most_common()),
            "failure_kinds": dict(Counter(f.kind for f in run.failures)),
            "first_failures": describe(run.failures).splitlines()[1:] if run.failures else []}
    with open(target, "a") as f:
        f.write(json.dumps(line) + "\n")


def check(name: str, run: FuzzRun) -> FuzzRun:
    """Record the run, then fail the test with the first failures if there are any."""
    record(name, run)
    assert not run.failures, describe(run.failures)
    return run


def describe(failures: list[Failure], limit: int = 5) -> str:
    """A short text of the first failures, for an assertion message."""
    lines = [f"{len(failures)} failing case(s)"]
    for f in failures[:limit]:
        lines.append(f"case {f.index} [{f.kind}]: {f.detail.strip().splitlines()[-1] if f.detail else ''}")
    return "\n".join(lines)
