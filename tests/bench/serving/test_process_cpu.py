"""bench.serving.process_cpu: a thread that spins for a known wall time reads as about one core; an idle one
as about none; a process that is gone reads NaN."""
import math
import multiprocessing
import os
import subprocess
import sys
import threading
import time

from infersight.bench.serving.process_cpu import cores_used, process_cpu_s, process_memory_mb, spawned_children, thread_cpu_s


def test_a_spinning_thread_reads_as_one_core_and_a_sleeping_one_as_none() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    def sleep() -> None:
        stop.wait()

    threads = [threading.Thread(target=spin), threading.Thread(target=sleep)]
    for t in threads:
        t.start()
    try:
        spinner, sleeper = (t.native_id for t in threads)
        before, wall0 = thread_cpu_s(os.getpid()), time.monotonic()
        time.sleep(1.0)
        after = thread_cpu_s(os.getpid())
        used = cores_used(before, after, time.monotonic() - wall0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    by_tid = {int(k.rsplit("/", 1)[1]): v for k, v in used.items()}
    # The spinner holds the GIL most of the time; on a loaded 2-core machine it still gets most of a core.
    assert 0.5 <= by_tid[spinner] <= 1.05
    assert by_tid[sleeper] <= 0.02
    assert list(used)[0].endswith(f"/{spinner}")  # busiest first


def test_a_process_that_is_gone_reads_nan() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert math.isnan(process_cpu_s(proc.pid))
    assert thread_cpu_s(proc.pid) == {}


def test_rss_grows_by_what_a_child_touches_and_a_gone_process_reads_nan() -> None:
    """A child that touches 64 MiB after its first reading shows about 64 MB more, all of it anonymous."""
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nsys.stdout.write('a\\n'); sys.stdout.flush()\n"
                              "sys.stdin.readline(); b = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                              "sys.stdout.write('b\\n'); sys.stdout.flush(); sys.stdin.readline()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "a\n"
        before = process_memory_mb(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "b\n"
        after = process_memory_mb(child.pid)
        grown, anon = after["rss"] - before["rss"], after["anon"] - before["anon"]
        assert 60 <= grown <= 72 and 60 <= anon <= 72, (grown, anon)  # its own heap, not shared pages
    finally:
        child.stdin.write("end\n")
        child.stdin.flush()
        child.wait(timeout=10)
    gone, none = process_memory_mb(child.pid), process_memory_mb(None)
    assert all(math.isnan(v) for v in (*gone.values(), *none.values()))


def _sleep() -> None:
    time.sleep(30)


def test_spawned_children_finds_a_multiprocessing_spawn_child_and_not_a_plain_one() -> None:
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    spawned = multiprocessing.get_context("spawn").Process(target=_sleep, daemon=True)
    spawned.start()
    try:
        # the spawn child's command line may take a moment to be its own (exec after fork)
        deadline = time.monotonic() + 10
        while spawned_children(os.getpid()) != [spawned.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spawned_children(os.getpid()) == [spawned.pid]
        assert spawned_children(plain.pid) == []
    finally:
        plain.kill()
        spawned.kill()
        plain.wait()
        spawned.join()
