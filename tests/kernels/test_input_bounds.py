"""kernels.readers.input_files (regular files only, byte limits, bounded gunzip) and kernels.bounded_run
(the analysis in a child with a deadline and a memory ceiling), each on exact tiny cases."""
from __future__ import annotations

import gzip
import os
import resource
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from infersight.kernels.bounded_run import RunLimits, run_bounded
from infersight.kernels.errors import TraceError
from infersight.kernels.readers.input_files import check_regular_file, gunzip_bounded, read_regular_file

REPO = Path(__file__).resolve().parents[2]
TRACE = Path(__file__).resolve().parent / "data" / "kineto_tiny-moe.json.gz"
HARD_AS = 3 << 30  # a `ulimit -v` far below this machine's memory, well above what the analysis needs


def test_non_regular_paths_are_refused_by_kind(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, words in ((fifo, "a FIFO"), (tmp_path, "a directory"), (Path("/dev/null"), "a character device")):
        with pytest.raises(TraceError, match=words):
            read_regular_file(path)
    with pytest.raises(TraceError, match="cannot read the file"):
        check_regular_file(tmp_path / "absent")


def test_size_limit_and_head(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    assert check_regular_file(path, 10) == 10 and read_regular_file(path, 10) == b"0123456789"
    assert read_regular_file(path, 10, head=4) == b"0123"
    with pytest.raises(TraceError, match="10 bytes, over the limit of 9 bytes"):
        read_regular_file(path, 9)


def test_gunzip_members_truncation_and_bomb() -> None:
    data = b"x" * 3_000_000
    two = gzip.compress(data, mtime=0) + gzip.compress(b"yz", mtime=0)
    assert gunzip_bounded(two, "p") == data + b"yz"
    assert gunzip_bounded(gzip.compress(b"ab", mtime=0) + b"\0\0", "p") == b"ab"
    with pytest.raises(TraceError, match="inflates to more than 1000 bytes"):
        gunzip_bounded(two, "p", 1000)
    with pytest.raises(TraceError, match="truncated or corrupt"):
        gunzip_bounded(two[:100], "p")
    with pytest.raises(TraceError, match="truncated or corrupt"):
        gunzip_bounded(b"\x1f\x8bnot a deflate stream", "p")


def test_run_bounded_returns_text_and_one_line_errors() -> None:
    limits = RunLimits(time_limit_s=30)
    assert run_bounded(lambda: "report " * 400_000, limits, "f") == "report " * 400_000  # > a pipe buffer

    def bad() -> str:
        raise TraceError("f: not a trace")
    with pytest.raises(TraceError, match="^f: not a trace$"):
        run_bounded(bad, limits, "f")

    def bug() -> str:
        return {}["missing"]
    with pytest.raises(TraceError, match=r"^f: cannot be analysed \(KeyError: 'missing'\)$"):
        run_bounded(bug, limits, "f")


def test_run_bounded_deadline_kill_and_memory() -> None:
    start = time.monotonic()
    with pytest.raises(TraceError, match="not analysed within 0.3 s"):
        run_bounded(lambda: time.sleep(30) or "", RunLimits(time_limit_s=0.3), "f")
    assert time.monotonic() - start < 10
    with pytest.raises(TraceError, match=f"stopped without a result \\(signal {int(signal.SIGKILL)}\\)"):
        run_bounded(lambda: os.kill(os.getpid(), signal.SIGKILL) or "", RunLimits(), "f")
    with pytest.raises(TraceError, match="out of memory"):
        run_bounded(lambda: str(len(bytearray(1 << 30))), RunLimits(memory_bytes=256 << 20), "f")


def test_run_bounded_prints_no_warning(capfd: pytest.CaptureFixture[str]) -> None:
    def noisy() -> str:
        warnings.warn("pandas would say this", RuntimeWarning)
        return str(np.array([np.nan]).astype(np.int64).size)  # numpy's "invalid value encountered in cast"
    assert run_bounded(noisy, RunLimits(), "f") == "1"
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def _lowered(limit: int) -> None:
    """preexec_fn: the child process runs under a hard RLIMIT_AS it cannot raise (as `ulimit -v`)."""
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_run_bounded_clamps_to_a_lowered_hard_limit() -> None:
    """Under a hard address-space limit the child gets exactly that limit (asking for more is
    refused: "not allowed to raise maximum limit"), and an allocation past it is still the one-line
    out-of-memory error."""
    script = (
        "import resource\n"
        "from infersight.kernels.bounded_run import RunLimits, run_bounded\n"
        "from infersight.kernels.errors import TraceError\n"
        "limits = RunLimits(time_limit_s=60, memory_bytes=1 << 40)\n"
        "print(run_bounded(lambda: repr(resource.getrlimit(resource.RLIMIT_AS)), limits, 'f'))\n"
        f"try: run_bounded(lambda: str(len(bytearray({HARD_AS}))), limits, 'f')\n"
        "except TraceError as exc: print(exc)\n")
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: _lowered(HARD_AS))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [repr((HARD_AS, HARD_AS)), "f: out of memory while analysing it (the file "
                                       "asks for more than the memory limit)"]


def test_analyze_runs_under_a_lowered_hard_limit() -> None:
    """`infersight analyze` under `ulimit -v`: the same report as without it, exit 0."""
    def analyze(limit: int | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infersight", "analyze", str(TRACE)], cwd=REPO,
                              capture_output=True, text=True, timeout=120,
                              preexec_fn=None if limit is None else lambda: _lowered(limit))
    free, lowered = analyze(None), analyze(HARD_AS)
    assert lowered.returncode == 0 and lowered.stderr == "", lowered.stderr
    assert free.returncode == 0 and lowered.stdout == free.stdout and "GPU time" in free.stdout
